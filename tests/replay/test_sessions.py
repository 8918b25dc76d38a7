"""Session-faithful replay: think time after each turn's completion on the candidate, subagents, order.

A 3-session agentic trace (one subagent) against the simulator with constant timing: in virtual
time every linked turn is sent exactly previous completion + think; over HTTP within 5 ms; a slower
candidate stretches sessions by its extra model time and keeps the think times.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from slogate.replay.cli.replay import build_workload, parser
from slogate.replay.run import ReplayOptions, replay
from slogate.traces.record import RequestRecord
from tests.replay.conftest import SAMPLES, reference_pacer
from tests.simserver import start_sim

BLOCK = 16


def _turns(n: int, first_id: int, t0: float, think: float, *, start_blocks: int = 4, grow: int = 2) -> list[dict]:
    out, ids, nxt, t = [], list(range(first_id, first_id + start_blocks)), first_id + start_blocks, t0
    for k in range(n):
        out.append({"t": t, "type": "n", "model": "m", "in": len(ids) * BLOCK, "out": 8, "hash_ids": list(ids),
                    "think_time": 0.0 if k == 0 else think, "api_time": 0.1})
        t += 0.1 + think
        ids += range(nxt, nxt + grow)
        nxt += grow
    return out


def write_sessions(folder: Path) -> list[Path]:
    """session a: 3 turns, a 2-turn subagent after turn 0; b: 3 turns; c: 2 turns (think 0.1–0.3 s)."""
    a = _turns(3, 1, 0.0, 0.3)
    sub = _turns(2, 100, 0.15, 0.1)
    sub[0]["think_time"] = 0.05
    docs = {
        "a": [a[0], {"t": 0.15, "type": "subagent", "requests": sub}, *a[1:]],
        "b": _turns(3, 1, 0.0, 0.2),
        "c": _turns(2, 1, 0.0, 0.25),
    }
    paths = []
    for name, reqs in docs.items():
        p = folder / f"{name}.json"
        p.write_text(json.dumps({"block_size": BLOCK, "hash_id_scope": "local", "requests": reqs}))
        paths.append(p)
    return paths


def _workload(paths: list[Path], *extra: str):
    ns = parser().parse_args([*map(str, paths), "--target", "sim:x/y", *extra])
    return build_workload(ns)[0]


def _by_session(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    by: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by[r.session].append(r)
    for turns in by.values():
        turns.sort(key=lambda r: r.turn)
    return by


def _gaps(records: list[RequestRecord]) -> list[float]:
    """send − (predecessor's completion + think) of every linked turn (subagent first turns included)."""
    by = _by_session(records)
    gaps = []
    for turns in by.values():
        for k, r in enumerate(turns):
            if k:
                prev = turns[k - 1]
            elif r.parent_session is not None:
                prev = max((p for p in by[r.parent_session] if p.t <= r.t), key=lambda p: p.t)
            else:
                continue
            gaps.append(r.t - (prev.t + prev.e2e) - r.think)
    return gaps


def _check_structure(records: list[RequestRecord]) -> None:
    by = _by_session(records)
    assert sorted(by) == ["a", "a.1", "b", "c"]
    assert [len(by[s]) for s in ("a", "a.1", "b", "c")] == [3, 2, 3, 2]
    assert all(r.parent_session == "a" for r in by["a.1"]) and by["b"][0].parent_session is None
    for turns in by.values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        assert all(turns[k].t > turns[k - 1].t for k in range(1, len(turns)))  # turn order kept
    assert all(r.error is None and r.status == 200 for r in records)


def _durations(records: list[RequestRecord]) -> dict[str, float]:
    return {s: max(r.t + r.e2e for r in t) - min(r.t for r in t) for s, t in _by_session(records).items()}


def test_virtual_turns_follow_completion_plus_think(tmp_path) -> None:
    w = _workload(write_sessions(tmp_path))
    fast = replay(w, ReplayOptions(target="sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=20&itl_ms=5",
                                   virtual=True, endpoint="completions"))
    _check_structure(fast.records)
    gaps = _gaps(fast.records)
    assert len(gaps) == 7 and max(abs(g) for g in gaps) < 1e-6
    s = fast.results.sessions
    assert s is not None and (s.sessions, s.subagents, s.turns) == (4, 1, 10)
    assert s.think_time_s == pytest.approx(2 * 0.3 + 0.05 + 0.1 + 2 * 0.2 + 0.25)
    assert set(s.ttft_by_turn) == {"0", "1", "2"}

    slow = replay(w, ReplayOptions(target="sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=50&itl_ms=10",
                                   virtual=True, endpoint="completions"))
    _check_structure(slow.records)
    assert max(abs(g) for g in _gaps(slow.records)) < 1e-6
    thinks = {(r.session, r.turn): r.think for r in fast.records}
    assert thinks == {(r.session, r.turn): r.think for r in slow.records}
    extra = 0.03 + 7 * 0.005  # per turn: TTFT +30 ms, 7 more gaps of +5 ms
    d_fast, d_slow = _durations(fast.records), _durations(slow.records)
    for name, turns in (("b", 3), ("c", 2), ("a.1", 2)):
        assert d_slow[name] - d_fast[name] == pytest.approx(turns * extra, abs=1e-6)
    # the parent's own chain is 3 turns; its subagent ends before the parent's last turn
    assert d_slow["a"] - d_fast["a"] == pytest.approx(3 * extra, abs=1e-6)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_http_turns_follow_completion_plus_think(tmp_path) -> None:
    w = _workload(write_sessions(tmp_path))
    with start_sim(timing="constant", ttft_ms=20, itl_ms=2) as sim:
        start_at = time.time() + 1.0
        # a bare pacer process over the same second measures this shared machine's stalls meanwhile
        with reference_pacer([k * 0.01 for k in range(100)], start_at) as ref:
            out = replay(w, ReplayOptions(target=sim.url, endpoint="completions", tokenizer="none",
                                          start_at=start_at))
    _check_structure(out.records)
    gaps = _gaps(out.records)
    assert len(gaps) == 7
    bound = max(0.005, ref.max + 0.002)  # 5 ms, unless other jobs stalled even a bare pacer longer
    assert max(abs(g) for g in gaps) < bound, (gaps, ref.max)
    assert out.results.sessions is not None and out.results.sessions.turns == 10
    assert out.results.prefix_cache_hit_rate is None  # constant timing: the sim has no prefix cache


def test_http_prefix_cache_hit_rate_from_the_server_counters(tmp_path) -> None:
    """Over HTTP the rate comes from the target's vllm:prefix_cache_* counters (before/after the run);
    it agrees with the virtual-time figure of the same sim."""
    w = _workload(write_sessions(tmp_path))
    with start_sim(gpu="h100-sxm", model="llama-3-8b", seed=1) as sim:
        live = replay(w, ReplayOptions(target=sim.url, endpoint="completions"))
    virtual = replay(w, ReplayOptions(target="sim:h100-sxm/llama-3-8b?seed=1", virtual=True, endpoint="completions"))
    assert 0.2 < virtual.results.prefix_cache_hit_rate < 1.0
    assert live.results.prefix_cache_hit_rate == pytest.approx(virtual.results.prefix_cache_hit_rate, abs=0.05)


def test_session_start_and_recorded_timing(tmp_path) -> None:
    paths = write_sessions(tmp_path)
    staggered = _workload(paths, "--session-start", "stagger:2")
    firsts = sorted(r.t for r in staggered.requests if r.turn == 0 and r.parent_session is None)
    assert firsts == [0.0, 2.0, 4.0]
    recorded = _workload(paths, "--session-timing", "recorded")
    assert all(r.after is None for r in recorded.requests)
    shard = _workload(paths, "--shard", "1/3")
    assert {r.session for r in shard.requests} in ({"b"}, {"c"}, {"a", "a.1"})
    a = _workload(paths, "--shard", "0/3")
    assert {r.session for r in a.requests} == {"a", "a.1"}  # a subagent stays with its parent


def test_stop_on_turn_error_ends_the_session(tmp_path) -> None:
    """A turn too long for the model's context fails; with stop its session sends nothing more."""
    paths = write_sessions(tmp_path)
    doc = json.loads(paths[1].read_text())
    doc["requests"][1]["in"] = 10_000  # llama-3-8b: 8k context
    paths[1].write_text(json.dumps(doc))
    target = "sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=20&itl_ms=5"
    cont = replay(_workload(paths), ReplayOptions(target=target, virtual=True, endpoint="completions"))
    stop = replay(_workload(paths, "--on-turn-error", "stop"),
                  ReplayOptions(target=target, virtual=True, endpoint="completions", stop_on_error=True))
    assert sum(r.session == "b" for r in cont.records) == 3
    assert sum(r.session == "b" for r in stop.records) == 2
    assert cont.results.sessions.failed_turns == 1
    assert (cont.results.sessions.unsent_turns, stop.results.sessions.unsent_turns) == (0, 1)  # counted, not lost


def test_bundled_agentic_sample_replays_on_llama31_70b() -> None:
    """`slogate replay A.json B.json C.json --target 'sim:h200/llama-3.1-70b?tp=4' --virtual`."""
    files = sorted((SAMPLES / "agentic").glob("*.json"))
    assert len(files) == 3
    w = _workload(files)
    out = replay(w, ReplayOptions(target="sim:h200/llama-3.1-70b?tp=4", virtual=True))
    assert len(out.records) == 12 and out.results.summary.failed == 0
    assert out.results.sessions.sessions == 4 and out.results.sessions.subagents == 1
    assert 0.3 < out.results.prefix_cache_hit_rate < 1.0


def test_sim_prefix_hit_rate_matches_the_ideal_and_drops_when_kv_is_small() -> None:
    from slogate.traces import formats
    from slogate.traces.stats import block_tokens, trace_stats

    files = sorted((SAMPLES / "agentic").glob("*.json"))
    header, records = formats.load(files, "agentic")
    ideal = trace_stats(records, block_tokens=block_tokens(header)).ideal_prefix_reuse
    w = _workload(files)
    roomy = replay(w, ReplayOptions(target="sim:h200/llama-3.1-70b?tp=4", virtual=True))
    print(f"prefix reuse: ideal {ideal:.3f}, sim hit rate {roomy.results.prefix_cache_hit_rate:.3f}")
    assert ideal is not None and abs(roomy.results.prefix_cache_hit_rate - ideal) < 0.02
    assert roomy.sim_stats["preemptions"] == 0
    small = replay(w, ReplayOptions(target="sim:h200/llama-3.1-70b?tp=4&kv_blocks=400", virtual=True))
    assert small.results.prefix_cache_hit_rate < ideal - 0.2 and small.sim_stats["preemptions"] > 0
    assert small.results.summary.failed == 0


def test_synthetic_agentic_workload_is_seeded_and_session_timed() -> None:
    from slogate.replay.profiles import synthesize

    def make(seed: int):
        ns = parser().parse_args(["--synthetic", "agentic:sessions=6,turns=4,think=0.5,subagents=0.5,system=1024",
                                  "--input-tokens", "fixed:300", "--output-tokens", "fixed:20", "--target", "x",
                                  "--seed", str(seed)])
        return build_workload(ns)[0]

    w = make(3)
    assert w.requests == make(3).requests and w.requests != make(4).requests
    roots = {r.session for r in w.requests if r.parent_session is None}
    assert len(roots) == 6 and any(r.parent_session for r in w.requests)
    firsts = [r for r in w.requests if r.turn == 0 and r.parent_session is None]
    assert all(r.hash_ids[:16] == firsts[0].hash_ids[:16] for r in firsts)  # the shared system prompt
    assert all(r.after is not None for r in w.requests if r.turn or r.parent_session)
    out = replay(w, ReplayOptions(target="sim:h100-sxm/llama-3.1-8b?timing=constant&ttft_ms=20&itl_ms=5",
                                  virtual=True, endpoint="completions"))
    assert len(out.records) == len(w.requests) and max(abs(g) for g in _gaps(out.records)) < 1e-6
    with pytest.raises(Exception, match="unknown --synthetic agentic parameter"):
        synthesize("agentic:users=3")


def test_captured_sessions_without_turns_get_turns_and_think_from_timings() -> None:
    """A gateway capture carries only the session hash: turns follow arrival order and think time is
    arrival − the previous request's completion (t + e2e)."""
    from slogate.replay.workload import from_records

    recs = [RequestRecord(t=0.0, input_tokens=10, output_tokens=5, e2e=1.0, session="s"),
            RequestRecord(t=0.5, input_tokens=10, output_tokens=5, e2e=1.0, session="u"),
            RequestRecord(t=3.0, input_tokens=20, output_tokens=5, e2e=2.0, session="s"),
            RequestRecord(t=6.5, input_tokens=30, output_tokens=5, e2e=1.0, session="s")]
    plans = from_records(recs)
    s = [p for p in plans if p.session == "s"]
    assert [(p.turn, p.think) for p in s] == [(0, None), (1, 2.0), (2, 1.5)]


@pytest.mark.parametrize("live", [False, True])
def test_parent_waits_for_a_subagent_when_the_trace_shows_it(tmp_path, live: bool) -> None:
    """The parent's next turn arrived (as recorded) after its subagent ended: on the candidate it is
    sent think time after the later of its own previous turn and the subagent's last turn."""
    a = _turns(2, 1, 0.0, 0.3)
    a[1]["t"] = 0.6  # the subagent below ends at 0.45: the parent waited for it, then thought 0.15 s
    sub = _turns(2, 100, 0.15, 0.1)
    sub[0]["think_time"] = 0.05
    p = tmp_path / "a.json"
    p.write_text(json.dumps({"block_size": BLOCK, "hash_id_scope": "local",
                             "requests": [a[0], {"t": 0.15, "type": "subagent", "requests": sub}, a[1]]}))
    w = _workload([p])
    parent1 = next(r for r in w.requests if r.session == "a" and r.turn == 1)
    assert parent1.join and parent1.think == pytest.approx(0.15)
    if live:
        with start_sim(timing="constant", ttft_ms=20, itl_ms=5) as sim:
            out = replay(w, ReplayOptions(target=sim.url, endpoint="completions", tokenizer="none"))
        tol = 0.02  # a shared machine's wake-ups; the order below is what matters
    else:
        out = replay(w, ReplayOptions(target="sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=20&itl_ms=5",
                                      virtual=True, endpoint="completions"))
        tol = 1e-6
    by = _by_session(out.records)
    sub_end = by["a.1"][-1].t + by["a.1"][-1].e2e
    own_end = by["a"][0].t + by["a"][0].e2e
    assert sub_end > own_end
    assert by["a"][1].t == pytest.approx(sub_end + 0.15, abs=tol)


def test_http_sessions_split_over_worker_processes(tmp_path) -> None:
    """Two sender processes: whole sessions per process, so each turn still follows its predecessor."""
    w = _workload(write_sessions(tmp_path))
    with start_sim(timing="constant", ttft_ms=20, itl_ms=2) as sim:
        out = replay(w, ReplayOptions(target=sim.url, endpoint="completions", tokenizer="none", workers=2))
    assert out.results.environment.workers == 2
    _check_structure(out.records)
    # order and think times (recorded timing would be ~60 ms off per turn); 3 processes share 2 cores here
    assert max(abs(g) for g in _gaps(out.records)) < 0.05


def test_session_header_value_is_opaque_per_run_and_the_flag_is_checked() -> None:
    from slogate.replay.cli.replay import session_header
    from slogate.replay.sessions import header_value
    from slogate.traces.usage import UsageError

    a = header_value("run1", "conv-a")
    assert a == header_value("run1", "conv-a") and len(a) == 16 and "conv" not in a
    assert a != header_value("run1", "conv-b") and a != header_value("run2", "conv-a")
    assert session_header("X-Session-Id") == "X-Session-Id" and session_header("off") is None
    with pytest.raises(UsageError, match="bad --session-header 'X Session'"):
        session_header("X Session")


def test_rate_with_session_timing_warns_that_think_times_are_kept(tmp_path, capsys) -> None:
    """The agentic samples' sessions all start at 0: `--rate 5` moves nothing under think timing (about
    1 req/s offered), which a warning now says; with recorded timing the whole timeline is rescaled."""
    from slogate.cli import main as slogate
    from slogate.replay.results import load

    agentic = Path(__file__).resolve().parents[2] / "traces" / "samples" / "agentic"
    args = ["replay", str(agentic), "--rate", "5", "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--quiet"]
    assert slogate([*args, "--out", str(tmp_path / "think")]) == 0
    assert "warning: with session timing, --speed/--rate move when sessions start" in capsys.readouterr().err
    assert load(tmp_path / "think").summary.offered_rate_rps < 2.5
    assert slogate([*args, "--session-timing", "recorded", "--out", str(tmp_path / "recorded")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert load(tmp_path / "recorded").summary.offered_rate_rps == pytest.approx(5.0)
