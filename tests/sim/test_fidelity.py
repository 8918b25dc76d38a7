"""Real clock vs virtual clock: the same small workload gives the same TTFT and E2E medians."""

from __future__ import annotations

import random
import statistics

import msgspec
import pytest

from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
from slogate.replay.sim.scheduler import V0_WATERMARK
from tests.sim.groundtruth import (
    DISTSERVE_KV_BLOCKS,
    ci_latency,
    compare,
    decode_by_batch,
    load,
    out_of_bounds,
    peak_blocks_in_use,
    slower_gpu,
)
from tests.sim.realclient import run_plan


def plan(n: int = 24, seed: int = 4) -> list[SimRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(8.0)
        out.append(SimRequest(arrival=t, prompt_tokens=rng.randint(100, 500), output_tokens=24))
    return out


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_virtual_matches_real_clock(sim_server):
    """Up to 3 attempts: on 2 shared cores another process can starve the server for tens of ms,
    which delays real tokens the virtual clock knows nothing about. The 10 % bound is unchanged.
    Each attempt gets a fresh server (an empty prefix cache, like the virtual run)."""
    reqs = plan()
    for _attempt in range(3):
        sim = sim_server(gpu="l4", seed=2)
        real, sent = await run_plan(sim.url, reqs)
        # the virtual run gets the arrivals the server really saw (the client may have sent late)
        as_sent = [msgspec.structs.replace(r, arrival=t) for r, t in zip(reqs, sent, strict=True)]
        virtual = simulate(as_sent, SimConfig(gpu="l4", model="llama-3-8b", seed=2))
        assert all(len(ts) == 24 for ts in real)
        v_ttft = statistics.median(r.ttft for r in virtual)
        v_e2e = statistics.median(r.e2e for r in virtual)
        r_ttft = statistics.median(ts[0] for ts in real)
        r_e2e = statistics.median(ts[-1] for ts in real)
        if abs(r_ttft - v_ttft) / v_ttft < 0.10 and abs(r_e2e - v_e2e) / v_e2e < 0.10:
            break
    assert abs(r_ttft - v_ttft) / v_ttft < 0.10, (r_ttft, v_ttft)
    assert abs(r_e2e - v_e2e) / v_e2e < 0.10, (r_e2e, v_e2e)


def test_v1_ci_latency_anchors_within_10_percent():
    """vLLM's CI latency test (batch 8, 32 in / 128 out) on H100, H200 and 70B TP4."""
    for row in ci_latency():
        assert abs(row["error_pct"]) <= 10.0, row


def test_vllm_v0_ground_truth_below_saturation():
    """DistServe's per-request vLLM (V0) runs, OPT-13B on one A100, replayed with --scheduler v0.

    Reached: medians within 10 % and p90s within 20 % at 1, 1.5, 2.5 and 3.5 req/s; the knee (TTFT
    p90 crosses 1 s) within 10 %. Not reached, and not asserted: the 2 req/s runs (their engine was
    slower, test_two_req_s_runs_ran_on_a_slower_engine), the TTFT tail at the knee (3 req/s: a burst
    tips the real engine over its KV capacity, the simulated one stays just below) and the queue in
    overload (4 req/s TTFT p50): both turn on a few percent of the real engine's speed, which differs
    by run (test_knee_tail_turns_on_a_few_percent_of_engine_speed).
    """
    table = compare()
    rows = {r["rate_req_s"]: r for r in table}
    assert {1.0, 1.5, 2.5, 3.5} <= set(rows)
    assert not out_of_bounds(table, rates=(1.0, 1.5, 2.5, 3.5)), table  # medians, p90s and the knee
    for rate in (3.0, 4.0):  # TPOT stays within 10 % even past saturation
        assert abs(rows[rate]["tpot_p50_err_pct"]) <= 10.0, rows[rate]


def test_v0_decode_step_by_batch_size():
    """The decode step with other prompts' prefill steps taken out, by batch size (decode_by_batch):
    within 10 % of the real engine's in every batch bin of 20+ requests at 1-4 req/s except 2 req/s
    (its slower engine). The real step at 50-60 sequences is the same in the 3, 3.5 and 4 req/s runs
    (75.7 / 76.2 / 74.7 ms). Where the simulated batch equals the real one, the 2.5 req/s run shows no
    per-sequence deficit (-1.6 / +0.3 % at 26 / 34 sequences) and the 3 req/s run one of 60-90 us per
    sequence (-3 to -8 %): a per-sequence V0 CPU cost fits one run and not the other (README)."""
    at_55 = []
    for rate in (1.0, 1.5, 2.5, 3.0, 3.5, 4.0):
        for row in decode_by_batch(rate):
            if row["requests"] >= 20:
                assert abs(row["err_pct"]) <= 10.0, (rate, row)
            if row["batch"] == "50-60":
                at_55.append(row["step_real_ms"])
    assert len(at_55) == 3 and max(at_55) <= 1.03 * min(at_55), at_55


def test_three_req_s_run_ran_on_a_slower_engine_at_equal_batch():
    """Why one step model cannot meet the 3 req/s tail: at 30-50 running sequences, with the
    simulator as the yardstick for batch and context (its step differs by under 3 % between the runs
    there), the real 3 req/s engine steps 6-9 % slower than the model, the 2.5 and 4 req/s engines
    within 2 % of it (the runs replay the same requests, README "Simulator fidelity")."""
    def ratios(rate: float) -> dict[str, float]:
        return {r["batch"]: r["step_real_ms"] / r["step_sim_ms"] for r in decode_by_batch(rate) if r["requests"] >= 20}

    slow = ratios(3.0)
    assert slow["30-40"] >= 1.05 and slow["40-50"] >= 1.05, slow
    for rate, bins in ((2.5, ("30-40",)), (4.0, ("30-40", "40-50"))):
        other = ratios(rate)
        assert all(abs(other[b] - 1) <= 0.02 for b in bins), (rate, other)


def test_knee_tail_turns_on_a_few_percent_of_engine_speed():
    """The 3 req/s TTFT tail is all or nothing on engine speed: the GPU's work 6 % slower (slower_gpu)
    reproduces it (p90 within 20 %) and the 4 req/s median, and puts the 3.5 req/s median past +20 %
    (2.5 req/s past +10 %). So no one speed meets both rows (speed_capacity_grid, README)."""
    slow = {r["rate_req_s"]: r for r in compare(slower_gpu(1.06))}
    assert abs(slow[3.0]["ttft_p90_err_pct"]) <= 20.0 and abs(slow[4.0]["ttft_p50_err_pct"]) <= 10.0, (slow[3.0], slow[4.0])
    assert slow[3.5]["ttft_p50_err_pct"] > 20.0 and slow[2.5]["ttft_p50_err_pct"] > 10.0, (slow[3.5], slow[2.5])


def test_distserve_kv_capacity_is_what_the_saturated_runs_hold():
    """DISTSERVE_KV_BLOCKS is the real engine's capacity as its saturated runs show it: each peaks
    within 2 % of it less V0's 1 % watermark; the unsaturated runs stay well below."""
    runs = load()
    usable = DISTSERVE_KV_BLOCKS - int(V0_WATERMARK * DISTSERVE_KV_BLOCKS)
    for rate in (3.0, 3.5, 4.0):
        assert abs(peak_blocks_in_use(runs[rate]) - usable) <= 0.02 * usable, rate
    assert peak_blocks_in_use(runs[2.5]) < 0.7 * usable


def test_two_req_s_runs_ran_on_a_slower_engine():
    """Why the 2 req/s row is not a model error: every run starts with the same request (55 prompt
    tokens, 4 output tokens) into an empty engine. In the 2 req/s run it decodes 16 % slower than in
    the 1.5 and 2.5-4 req/s runs, and the same requests decode slower at 2 than at 2.5 req/s (more
    load). The 100-request 2 req/s run in DistServe's data shows the same (29.0 ms, README)."""
    runs = load()
    first = {rate: reqs[0] for rate, reqs in runs.items()}
    assert all(f["prompt_tokens"] == 55 and f["output_tokens"] == 4 for f in first.values())
    usual = statistics.median(first[r]["tpot_ms"] for r in (1.5, 2.5, 3.0, 3.5, 4.0))
    assert first[2.0]["tpot_ms"] > 1.15 * usual, (first[2.0], usual)
    a, b = runs[2.0][:150], runs[2.5][:150]
    assert [r["prompt_tokens"] for r in a] == [r["prompt_tokens"] for r in b]
    assert sum(x["tpot_ms"] > y["tpot_ms"] for x, y in zip(a, b, strict=True)) > 0.7 * len(a)


def test_moe_step_streams_only_the_experts_its_tokens_route_to():
    """Uniform top-k routing: one token reads the active parameters, a step of many tokens all of them,
    in between E·(1 − (1 − k/E)^T) experts per layer; a dense model always reads everything."""
    from slogate.replay.sim.catalog import find_model

    mixtral, dense = find_model("mixtral-8x7b"), find_model("llama-3-8b")
    assert mixtral.weights_read_b(1) == pytest.approx(12.9)
    assert mixtral.weights_read_b(4096) == pytest.approx(46.7)
    reads = [mixtral.weights_read_b(t) for t in (1, 2, 4, 8, 16, 32)]
    assert reads == sorted(reads) and len(set(reads)) == len(reads)
    per_expert = (46.7 - 12.9) / 6
    assert mixtral.weights_read_b(2) == pytest.approx(12.9 - 2 * per_expert + 8 * per_expert * (1 - 0.75 ** 2))
    assert dense.weights_read_b(1) == dense.weights_read_b(512) == 8.03


def test_host_floor_bounds_every_step_from_below():
    """--host-step-ms / --host-seq-us: a step lasts at least the host's work; a longer GPU step is
    unchanged; negative values are refused with the flag's meaning."""
    from slogate.replay.sim.catalog import find_gpu, find_model
    from slogate.replay.sim.steptime import Roofline
    from slogate.traces.usage import UsageError

    gpu, model = find_gpu("h100-sxm"), find_model("llama-3-8b")
    bare = Roofline(gpu, model, tp=4, jitter=0.0)
    floored = Roofline(gpu, model, tp=4, jitter=0.0, host_step_s=6e-3, host_seq_s=60e-6, host_kv_s=30e-9)
    assert bare(1, 1, 200, 200) < 6e-3
    assert floored(1, 1, 200, 200) == pytest.approx(6e-3 + 60e-6 + 200 * 30e-9)
    assert floored(64, 64, 64 * 200, 64 * 200) == pytest.approx(
        max(bare(64, 64, 64 * 200, 64 * 200), 6e-3 + 64 * 60e-6 + 64 * 200 * 30e-9))
    assert floored(8192, 4, 8192, 8192 * 4096) == bare(8192, 4, 8192, 8192 * 4096)  # a long prefill: GPU-bound
    with pytest.raises(UsageError, match="host time per step"):
        Roofline(gpu, model, host_step_s=-1e-3)


def test_offline_batches_hold_where_the_model_holds():
    """LLM-Inference-Bench's vLLM offline batches (tests/bench/ground_truth/README.md), 441 runs on
    A100-40GB, H100 and GH200, 84 setup × batch-size cells (median error over the lengths ≤ 10 %, p90
    |error| ≤ 20 % is in bounds). Seven setups stay in bounds at every batch size (Llama-3-8B and
    Llama-2-7B on one H100, Llama-3-8B and Mistral-7B on one A100, 8B on 2 and 4 H100s, 70B on 4); of the 76 cells outside the two setups the host floors are read from, at least 61
    are in bounds (28 before this model, 56 before the A100's all-reduce took Vidur's measured line), and
    without the floors the held-out dense TP 4 setups on H100s at batch 1 are 45-47 % fast. On A100s the
    measured all-reduce (42 µs + 175 GB/s, catalog.py) carries what the floor did: Mistral-7B on four is
    within 10 % without it (−27 % with the datasheet's link), and 8 of the 9 two-A100 cells at batch ≥ 16
    are in bounds (2 with it). The routed-experts read and the all-reduce take Mixtral at batch 1 from +120 %
    to within 10 %."""
    from tests.sim.groundtruth import (
        OFFLINE_FLOOR_SETUPS,
        offline_batches,
        offline_config,
        offline_summary,
    )
    from tests.sim.groundtruth import offline_in_bounds as inside

    summary = offline_summary(offline_batches())
    by = {(s["gpu"], s["model"], s["tp"], s["batch"]): s for s in summary}

    held = [("h100-sxm", "llama-3-8b", 1), ("h100-sxm", "llama-2-7b", 1), ("a100-40g", "llama-3-8b", 1),
            ("a100-40g", "mistral-7b", 1), ("h100-sxm", "llama-3-8b", 2), ("h100-sxm", "llama-3-70b", 4),
            ("h100-sxm", "llama-3-8b", 4)]
    for setup in held:
        for b in (1, 16, 32, 64):
            assert inside(by[(*setup, b)]), by[(*setup, b)]
    held_out = [s for s in summary if (s["gpu"], s["model"], s["tp"]) not in OFFLINE_FLOOR_SETUPS]
    assert len(held_out) == 76 and sum(map(inside, held_out)) >= 61, sum(map(inside, held_out))
    assert abs(by[("a100-40g", "mixtral-8x7b", 4, 1)]["median_err_pct"]) <= 10
    two_a100 = [s for s in summary if s["gpu"] == "a100-40g" and s["tp"] == 2 and s["batch"] >= 16]
    assert len(two_a100) == 9 and sum(map(inside, two_a100)) >= 8, two_a100
    dense_tp4 = [("h100-sxm", "llama-2-7b"), ("h100-sxm", "mistral-7b"), ("a100-40g", "mistral-7b")]
    assert all(abs(by[(g, m, 4, 1)]["median_err_pct"]) <= 10 for g, m in dense_tp4)
    bare = offline_summary(offline_batches(config=lambda g, m, tp: offline_config(g, m, tp, host=False)))
    bare_by = {(s["gpu"], s["model"], s["tp"], s["batch"]): s for s in bare}
    assert all(bare_by[("h100-sxm", m, 4, 1)]["median_err_pct"] < -20 for m in ("llama-2-7b", "mistral-7b"))
    assert abs(bare_by[("a100-40g", "mistral-7b", 4, 1)]["median_err_pct"]) <= 10
