"""`slogate plan`'s shortcuts (replay.plan.capacity.Reuse, the hinted bracket, search points without
token times) against the plain search: a run whose running count stayed below max_num_seqs is the run
of any limit at or above its peak, and the plan's capacities match the unshortened search."""

from __future__ import annotations

import random

import msgspec
import pytest

from slogate.replay import workload as wl
from slogate.replay.plan import candidates as cands
from slogate.replay.plan.capacity import MAX_SPEED, MIN_SPEED, _bracket
from slogate.replay.plan.planner import Settings, families, plan
from slogate.replay.sim.engine import SimConfig, SimRequest, run_virtual
from slogate.traces.slo import parse_slo


def poisson(n: int, rate: float, seed: int = 3) -> list[SimRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(SimRequest(arrival=t, prompt_tokens=rng.randint(50, 1500), output_tokens=rng.randint(5, 300)))
    return out


def test_a_limit_at_or_above_the_peak_gives_the_same_run() -> None:
    reqs = poisson(300, 40.0)
    big = run_virtual(reqs, SimConfig(gpu="a100-80g", max_num_seqs=512))
    peak = big.stats.peak_running
    assert 8 < peak < 512
    same = run_virtual(reqs, SimConfig(gpu="a100-80g", max_num_seqs=peak))
    assert [r.token_times for r in same.results] == [r.token_times for r in big.results]
    tighter = run_virtual(reqs, SimConfig(gpu="a100-80g", max_num_seqs=peak // 2))
    assert tighter.stats.peak_running == peak // 2  # the limit binds: a different run
    assert [r.token_times for r in tighter.results] != [r.token_times for r in big.results]


def test_families_split_by_everything_but_max_num_seqs_in_descending_order() -> None:
    grid = cands.expand([cands.parse_candidate("a100-80g/llama-3-8b"), cands.parse_candidate("l4/llama-3-8b?dtype=int4")],
                        cands.parse_grid(["max_num_seqs=32,512,128"]))
    tasks = families(grid)
    assert sorted(i for t in tasks for i in t) == list(range(6))
    for t in tasks:
        assert len({(grid[i].gpu, grid[i].options.get("dtype")) for i in t}) == 1
        seqs = [int(grid[i].options["max_num_seqs"]) for i in t]
        assert seqs == sorted(seqs, reverse=True)


def test_bracket_from_a_hint_closes_in_two_runs_when_the_hint_is_right() -> None:
    asked: list[float] = []

    def ok(speed: float) -> bool:
        asked.append(speed)
        return speed <= 3.0

    assert _bracket(ok, 3.0, 1.02) == (3.0, 3.0 * 1.02) and len(asked) == 2
    asked.clear()
    lo, hi = _bracket(ok, 10.0, 1.02)
    assert lo is not None and hi is not None and lo <= 3.0 < hi and len(asked) <= 8
    assert _bracket(lambda s: True, 100.0, 1.5) == (MAX_SPEED, None)
    assert _bracket(lambda s: False, 0.01, 1.5) == (None, MIN_SPEED)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_fast_plan_matches_the_plain_search_within_its_precision() -> None:
    reqs = poisson(240, 6.0, seed=5)
    w = wl.Workload(requests=[wl.PlannedRequest(index=i, t=r.arrival, input_tokens=r.prompt_tokens,
                                                output_tokens=r.output_tokens) for i, r in enumerate(reqs)],
                    source="test")
    grid = cands.expand([cands.parse_candidate("a100-80g/llama-3-8b")], cands.parse_grid(["max_num_seqs=4,256,512"]))
    settings = Settings(slo=parse_slo("ttft=1,tpot=0.05"), precision=0.05)
    fast = plan(w, grid, settings)
    plain = plan(w, grid, msgspec.structs.replace(settings, fast=False))
    for f, p in zip(fast.candidates, plain.candidates, strict=True):
        assert f.candidate == p.candidate
        assert f.capacity_rps is not None and p.capacity_rps is not None
        assert abs(f.capacity_rps / p.capacity_rps - 1) <= 0.05 + 1e-9, (f.candidate, f.capacity_rps, p.capacity_rps)
    by = {c.candidate: c for c in fast.candidates}
    # 256 and 512 never bind on this trace: the same search, answered from the first one's points
    assert by["a100-80g/llama-3-8b?max_num_seqs=256"].capacity_rps == by["a100-80g/llama-3-8b?max_num_seqs=512"].capacity_rps
    assert by["a100-80g/llama-3-8b?max_num_seqs=4"].capacity_rps < by["a100-80g/llama-3-8b?max_num_seqs=256"].capacity_rps


@pytest.mark.parametrize("attainment", [None, 0.99])  # run to the end (operating point) / stop early (search)
def test_points_without_token_times_have_the_same_numbers(attainment: float | None) -> None:
    """plan simulates every point without per-token times but where the throughput window cuts a
    request (replay.virtual.window_cut): its curve, rates, goodput and cost row equal those of a run
    with all token times, exactly; only the ITL distribution is left out."""
    from slogate.replay.plan import capacity as cap
    from slogate.replay.plan import cost as costs

    reqs = poisson(400, 8.0, seed=11)
    w = wl.Workload(requests=[wl.PlannedRequest(index=i, t=r.arrival, input_tokens=r.prompt_tokens,
                                                output_tokens=r.output_tokens) for i, r in enumerate(reqs)],
                    source="test")
    slo = parse_slo("ttft=1,tpot=0.05")
    rows = []
    for chunk_times in (True, False):
        point = cap.runner(w, "sim:a100-80g/llama-3-8b", slo, "llama-3-8b", attainment=attainment,
                           chunk_times=chunk_times)(0.9)
        s = point.summary
        c = costs.cost(s, gpus_per_replica=1, operating_rps=s.offered_rate_rps, peak_rps=10.0, at_rate_rps=None,
                       usd_per_gpu_hour=1.8)
        rows.append((point, s, c))
    (p1, s1, c1), (p0, s0, c0) = rows
    assert (p0.stopped_at is None) == (attainment is None) and p0.stopped_at == p1.stopped_at
    if attainment is None:
        assert 0.5 < (s1.slo_attainment or 0) < 1.0  # some requests miss the SLO: goodput ≠ throughput
        assert s1.drain_requests > 0  # the window cuts requests: their token times decide the rates
    else:  # the stopped run aborts what is in flight: those records keep their token times
        assert s1.failed > 0 and s1.failed == s0.failed
    assert p0.curve == p1.curve and c0 == c1
    for field in ("request_rate_rps", "output_tokens_per_s", "total_tokens_per_s", "goodput_rps",
                  "goodput_tokens_per_s", "drain_output_tokens", "slo_attainment", "ttft_s", "tpot_s", "e2e_s"):
        assert getattr(s0, field) == getattr(s1, field), field
    assert (p0.peak_in_flight, p0.ttft_violations, p0.tpot_violations) == (p1.peak_in_flight, p1.ttft_violations,
                                                                           p1.tpot_violations)
    assert s1.itl_s.count > 0 and s0.itl_s.count == 0  # the one thing all token times add: the ITL gaps


@pytest.mark.slow  # spawns plan's worker processes
def test_jobs_interleave_families_and_never_change_a_result() -> None:
    """--jobs 2 over five engine families: five processes taking turns on two slots (planner._held),
    with every row as one process gives it, point for point."""
    reqs = poisson(120, 8.0, seed=11)
    w = wl.Workload(requests=[wl.PlannedRequest(index=i, t=r.arrival, input_tokens=r.prompt_tokens,
                                                output_tokens=r.output_tokens) for i, r in enumerate(reqs)],
                    source="test")
    grid = cands.parse_candidates("a100-80g/llama-3-8b,h100-sxm/llama-3-8b,l40s/llama-3-8b?dtype=fp8,"
                                  "l4/llama-3-8b?dtype=int4,h100-sxm/llama-3-8b?max_num_batched_tokens=2048")
    assert len(families(grid)) == 5
    settings = Settings(slo=parse_slo("ttft=1,tpot=0.05"), precision=0.05)
    one, two = plan(w, grid, settings, jobs=1), plan(w, grid, settings, jobs=2)
    strip = [msgspec.structs.replace(c, wall_s=0.0) for c in one.candidates]
    assert [msgspec.structs.replace(c, wall_s=0.0) for c in two.candidates] == strip
    assert all(c.capacity_rps for c in one.candidates)


def test_held_runner_simulates_only_while_it_holds_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from slogate.replay.plan import planner

    monkeypatch.setattr(planner, "_SLOTS", threading.BoundedSemaphore(2))
    inside, most, lock = 0, 0, threading.Lock()
    pair = threading.Barrier(2, timeout=10)  # two inside at once, then room for a third to push in

    def run(speed: float):  # type: ignore[no-untyped-def]
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        pair.wait()
        time.sleep(0.02)
        with lock:
            inside -= 1
        return speed

    held = planner._held(run)  # type: ignore[arg-type]
    threads = [threading.Thread(target=held, args=(float(i),)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 2
    monkeypatch.setattr(planner, "_SLOTS", None)
    assert planner._held(run) is run  # type: ignore[arg-type]  # one process: no turns
