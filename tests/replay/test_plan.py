"""`slogate plan`: the issue's acceptance command on the bundled Azure conversation trace (two minutes
of it), the capacity search on a simulator whose capacity is known (test_compare_runs), feasibility
arithmetic, candidate/grid/price parsing, replicas and cost, and bad input as one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest

from slogate.cli import main as slogate
from slogate.replay.plan import candidates as cands
from slogate.replay.plan import cost, feasibility
from slogate.replay.plan.output import load, progress_line
from slogate.replay.sim import catalog
from slogate.replay.sim.catalog import GiB, find_gpu, find_model
from slogate.replay.sim.kvcache import ACTIVATION_RESERVE_GIB, BLOCK_SIZE
from slogate.traces.usage import UsageError
from tests.replay.test_compare_runs import MAX_SEQS, capacity_rps, make_trace

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "samples" / "azure_conv_10min.csv"
CANDIDATES = ("a100-80g/llama-3-8b,h100-sxm/llama-3-8b,l40s/llama-3-8b?dtype=fp8,l4/llama-3-8b?dtype=int4,"
              "a100-80g/llama-3-70b")
PRICES = "a100-80g=1.8,h100-sxm=3,l40s=1.2,l4=0.8"


@pytest.fixture(scope="module")
def acceptance(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The issue's command on the first two minutes of the trace (the whole trace: see tests/bench/plan_speed.py)."""
    out = tmp_path_factory.mktemp("plan")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert slogate(["plan", str(SAMPLE), "--slo", "ttft=2,tpot=0.1", "--candidates", CANDIDATES,
                        "--price", PRICES, "--window", "0:120", "--json", "--out", str(out)]) == 0
    return json.loads(buf.getvalue()), out


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_acceptance_command_prints_and_writes_the_plan(acceptance: tuple[dict, Path]) -> None:
    printed, out = acceptance
    written = load(out)
    assert printed["schema_version"] == written.schema_version == 1
    by = {c["candidate"]: c for c in printed["candidates"]}
    assert set(by) == set(CANDIDATES.split(","))
    assert [c.candidate for c in written.candidates] == [c["candidate"] for c in printed["candidates"]]
    for c in printed["candidates"]:
        for key in ("candidate", "fits", "reason", "capacity_rps", "knee_rps", "operating_rps", "replicas",
                    "cost_per_million_good_tokens", "cost_per_1k_good_requests", "binding_limit"):
            assert key in c


def test_70b_in_bf16_does_not_fit_one_a100_and_says_why(acceptance: tuple[dict, Path]) -> None:
    row = next(c for c in acceptance[0]["candidates"] if c["candidate"] == "a100-80g/llama-3-70b")
    assert row["fits"] is False and row["capacity_rps"] is None and row["replicas"] is None
    assert "131.5 GiB" in row["reason"] and "raise tp" in row["reason"]


def test_capacities_follow_the_hardware_and_every_fit_has_replicas_and_cost(acceptance: tuple[dict, Path]) -> None:
    printed, _ = acceptance
    by = {c["candidate"]: c for c in printed["candidates"]}
    cap = {k.split("/")[0]: v["capacity_rps"] for k, v in by.items() if v["fits"]}
    assert cap["h100-sxm"] > cap["a100-80g"] > cap["l40s"] > cap["l4"] > 0
    for row in by.values():
        if not row["fits"]:
            continue
        assert row["operating_rps"] == pytest.approx(row["capacity_rps"] * 0.9, rel=0.02)
        # replicas cover the busiest minute at the operating point
        assert row["replicas"] == math.ceil(printed["peak_rps"] / row["operating_rps"] - 1e-9)
        assert row["cost_per_million_good_tokens"] > 0 and row["cost_per_1k_good_requests"] > 0
        # $/M good tokens is the GPU-hour price over the good tokens per hour at the operating point
        price = {"a100-80g": 1.8, "h100-sxm": 3, "l40s": 1.2, "l4": 0.8}[row["candidate"].split("/")[0]]
        assert row["cost_per_million_good_tokens"] == pytest.approx(price / 3600 / row["goodput_tokens_per_s"] * 1e6)
        assert row["binding_limit"] in ("kv_capacity", "prefill_compute", "decode_bandwidth",
                                        "scheduler:max_num_seqs", "scheduler:token_budget")
        # the search bracketed the boundary: a passing point at capacity and a failing one just above
        pts = {p["speed"]: p for p in row["points"]}
        assert pts[row["capacity_speed"]]["slo_attainment"] >= 0.99
        above = min(s for s in pts if s > row["capacity_speed"] and s != row["operating_speed"])
        assert pts[above]["slo_attainment"] < 0.99 and above / row["capacity_speed"] <= 1.021
    # the table is sorted by cost: fitting candidates by $/M good tokens, the misfit last
    costs = [c["cost_per_million_good_tokens"] for c in printed["candidates"] if c["fits"]]
    assert costs == sorted(costs) and printed["candidates"][-1]["fits"] is False


def test_plain_table_sorted_by_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=5)
    assert slogate(["plan", str(trace), "--slo", "ttft=0.1", "--attainment", "0.9", "--price", "h100-sxm=3,a100-80g=1",
                    "--candidates", f"h100-sxm/llama-3-8b?max_num_seqs={MAX_SEQS}&jitter=0,"
                    f"a100-80g/llama-3-8b?max_num_seqs={MAX_SEQS}&jitter=0", "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("candidate") and "binding limit" in lines[0]
    assert "\x1b[" not in "".join(lines)  # not a TTY: plain text
    rows = [line.split()[0] for line in lines[1:3]]
    assert rows == ["a100-80g/llama-3-8b?max_num_seqs=4&jitter=0", "h100-sxm/llama-3-8b?max_num_seqs=4&jitter=0"]


def test_capacity_search_finds_the_known_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=10)
    out = tmp_path / "p"
    assert slogate(["plan", str(trace), "--slo", "ttft=0.1", "--attainment", "0.9",
                    "--candidates", f"h100-sxm/llama-3-8b?max_num_seqs={MAX_SEQS}&jitter=0", "--out", str(out)]) == 0
    row = load(out).candidates[0]
    assert row.capacity_rps == pytest.approx(capacity_rps(), rel=0.10)
    assert row.binding_limit == "scheduler:max_num_seqs"  # 4 seats are the whole engine
    assert row.knee_rps is not None and row.knee_rps <= capacity_rps() * 1.1


def test_grid_expands_every_candidate() -> None:
    base = cands.parse_candidates("h100/llama-3-8b?max_num_seqs=32,l4/llama-3-8b?dtype=int4")
    grid = cands.parse_grid(["max_num_seqs=64,128", "max-num-batched-tokens=2048,8192"])
    out = cands.expand(base, grid)
    assert len(out) == 8
    assert out[0].spec == "h100/llama-3-8b?max_num_seqs=64&max_num_batched_tokens=2048"
    assert out[-1].spec == "l4/llama-3-8b?dtype=int4&max_num_seqs=128&max_num_batched_tokens=8192"
    assert cands.expand(base, []) == base


def test_feasibility_is_the_sims_memory_arithmetic() -> None:
    gpu, model = find_gpu("l4"), find_model("llama-3-8b")
    fit = feasibility.check(cands.parse_candidate("l4/llama-3-8b?dtype=int4"), 4096)
    weights = model.params_b * 1e9 * catalog.precision("int4").weight_bytes / GiB  # 4-bit + group scales
    assert fit.fits and fit.weights_gib == pytest.approx(weights, abs=0.01)
    assert fit.kv_gib == pytest.approx(gpu.memory_gib * 0.9 - weights - ACTIVATION_RESERVE_GIB, abs=0.01)
    assert fit.max_resident_seqs == fit.kv_blocks // (4096 // BLOCK_SIZE) > 0
    tp2 = feasibility.check(cands.parse_candidate("a100-80g/llama-3-70b?tp=2"), 4096)
    assert tp2.fits and tp2.max_resident_seqs > 0
    assert not feasibility.check(cands.parse_candidate("l4/llama-3-8b"), 200_000).fits


def test_peak_rate_replicas_and_cost() -> None:
    arrivals = [i * 0.5 for i in range(240)] + [120 + i * 0.1 for i in range(600)]  # 2/s, then 10/s
    assert cost.peak_rate(arrivals, 60) == pytest.approx(10.0, rel=0.02)
    assert cost.peak_rate([0.0, 1.0], 60) == pytest.approx(2.0)  # shorter than the window: its own rate
    assert cost.replicas_for(10.0, 4.0) == 3 and cost.replicas_for(8.0, 4.0) == 2 and cost.replicas_for(1, None) is None


@pytest.mark.parametrize(("args", "fragment"), [
    (["--candidates", "h100"], "bad candidate 'h100'"),
    (["--candidates", "b200/llama-3-8b"], "unknown GPU 'b200'"),
    (["--candidates", "h100/llama-3-8b?tpp=2"], "unknown option 'tpp'"),
    (["--candidates", "h100/llama-3-8b?tp=two"], "tp='two'"),
    (["--candidates", "h100/llama-3-8b?dtype=fp3"], "unknown dtype 'fp3'"),
    (["--candidates", "h100/llama-3-8b", "--grid", "max_num_seqs"], "bad --grid"),
    (["--candidates", "h100/llama-3-8b", "--price", "h100=cheap"], "bad --price"),
    (["--candidates", "h100/llama-3-8b", "--attainment", "1.5"], "bad --attainment"),
    (["--candidates", "h100/llama-3-8b", "--headroom", "1"], "bad --headroom"),
    (["--candidates", "h100/llama-3-8b", "--peak-window", "soon"], "bad duration 'soon'"),
])
def test_bad_values_are_one_line_usage_errors(args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["plan", str(SAMPLE), "--slo", "ttft=2", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        slogate(["plan", "--help"])
    assert "examples:" in capsys.readouterr().out
    with pytest.raises(UsageError):
        cands.parse_prices("l4")


def test_early_stop_keeps_the_capacity_and_stops_overloaded_points(tmp_path: Path) -> None:
    from slogate.replay.cli.plan import build_parser, settings_from, workload_from
    from slogate.replay.plan.planner import plan

    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=10)
    ns = build_parser().parse_args([str(trace), "--slo", "ttft=0.1", "--attainment", "0.9", "--candidates", "x/y"])
    workload, _ = workload_from(ns)
    cand = cands.parse_candidate(f"h100-sxm/llama-3-8b?max_num_seqs={MAX_SEQS}&jitter=0")
    full = plan(workload, [cand], msgspec.structs.replace(settings_from(ns), early_stop=False)).candidates[0]
    fast = plan(workload, [cand], settings_from(ns)).candidates[0]
    assert fast.capacity_rps == full.capacity_rps and fast.capacity_speed == full.capacity_speed
    assert all(p.stopped_at is None for p in full.points)
    stopped = [p for p in fast.points if p.stopped_at is not None]
    assert stopped and all(p.slo_attainment is not None and p.slo_attainment < 0.9 for p in stopped)
    span = 10.0 / min(p.speed for p in stopped)  # the trace's length at the slowest stopped speed
    assert all(p.stopped_at < span for p in stopped)
    assert all(p.stopped_at is None for p in fast.points if p.slo_attainment is not None and p.slo_attainment >= 0.9)
    line = progress_line(fast)
    assert f"{len(stopped)} stopped early: attainment lost at t=" in line and line.startswith(f"plan: {fast.candidate}")


def test_sim_stop_hook_ends_the_run_where_it_fires() -> None:
    from slogate.replay.sim.engine import SimConfig, SimRequest, run_virtual

    reqs = [SimRequest(arrival=i * 0.01, prompt_tokens=64, output_tokens=32) for i in range(200)]
    config = SimConfig(gpu="h100-sxm", model="llama-3-8b", jitter=0)
    whole = run_virtual(reqs, config)
    seen: list[float] = []

    def after_ten(_res: object, t: float) -> bool:
        seen.append(t)
        return len(seen) >= 10

    cut = run_virtual(reqs, config, stop_when=after_ten)
    assert whole.stats.stopped_at is None and whole.stats.errors == 0
    assert cut.stats.stopped_at == seen[9] and len(seen) == 10  # never called again once it fired
    assert cut.stats.steps < whole.stats.steps
    assert sum(r.error == "aborted" for r in cut.results) >= 150  # the rest never finished


def test_tp_scaling_efficiency_over_nvlink_and_pcie(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Prefill-heavy requests: each token's activations are all-reduced twice per layer, which PCIe
    (32 GB/s) makes cost about half the prefill compute at tp=2 and the A100's NVLink (42 µs + 175 GB/s,
    the catalog's line through Vidur's NCCL profile) about a seventh; tp=2 also doubles the KV space."""
    from slogate.traces.record import RequestRecord, TraceHeader
    from slogate.traces.segments import write_segment

    trace = tmp_path / "prefill.jsonl.zst"
    write_segment(trace, TraceHeader(source="test", block_unit="tokens", block_size=16),
                  [RequestRecord(t=i / 10, input_tokens=1024, output_tokens=16, max_tokens=16) for i in range(60)])
    out = tmp_path / "p"
    assert slogate(["plan", str(trace), "--slo", "ttft=0.5", "--attainment", "0.9", "--out", str(out),
                    "--candidates", "a100-80g/llama-3-8b?jitter=0", "--grid", "interconnect=nvlink,pcie4",
                    "--grid", "tp=1,2"]) == 0
    rows = {c.candidate: c for c in load(out).candidates}
    one_nv, one_pcie = rows["a100-80g/llama-3-8b?jitter=0&interconnect=nvlink&tp=1"], \
        rows["a100-80g/llama-3-8b?jitter=0&interconnect=pcie4&tp=1"]
    nv, pcie = rows["a100-80g/llama-3-8b?jitter=0&interconnect=nvlink&tp=2"], \
        rows["a100-80g/llama-3-8b?jitter=0&interconnect=pcie4&tp=2"]
    assert one_nv.capacity_rps == one_pcie.capacity_rps  # tp=1 has no all-reduce: the link does not matter
    assert one_nv.tp_speedup is None and one_nv.interconnect == "nvlink" and one_pcie.interconnect == "pcie4"
    assert nv.tp_base == pcie.tp_base == 1 and nv.gpus_per_replica == 2
    assert nv.tp_speedup == pytest.approx(nv.capacity_rps / one_nv.capacity_rps, rel=1e-3)
    assert nv.tp_efficiency == pytest.approx(nv.tp_speedup / 2, rel=1e-3)
    assert pcie.tp_efficiency < 0.85 < 0.95 < nv.tp_efficiency  # PCIe loses a real share, NVLink almost none
    table = capsys.readouterr().out
    assert f"tp 1→2: {pcie.tp_speedup:.2f}× ({pcie.tp_efficiency:.0%}) pcie4" in table


def test_interconnect_errors_name_the_fix() -> None:
    with pytest.raises(UsageError, match="L40S has no NVLink"):
        cands.parse_candidate("l40s/llama-3-8b?tp=2&interconnect=nvlink")
    with pytest.raises(UsageError, match="interconnect='infiniband'"):
        cands.parse_candidate("h100/llama-3-8b?interconnect=infiniband")
    cand = cands.parse_candidate("h100-sxm/llama-3-8b?tp=2&interconnect=pcie5")
    assert cand.target == "sim:h100-sxm/llama-3-8b?tp=2&gpu_set=link_gb_s=64,link_latency_us=15"
    # an A100's all-reduce starts no faster over PCIe than over its NVLink (42 µs, the catalog's)
    cand = cands.parse_candidate("a100-80g/llama-3-8b?tp=2&interconnect=pcie4")
    assert cand.target == "sim:a100-80g/llama-3-8b?tp=2&gpu_set=link_gb_s=32,link_latency_us=42"


def test_a_host_floor_in_the_candidate_lowers_a_host_bound_tp_capacity(tmp_path: Path, capsys) -> None:
    """`?host_step_ms=…&host_seq_us=…&host_kv_ns=…` reach the simulated engine: Llama-3-8B on four H100s
    has a ~3 ms GPU step, so with LLM-Inference-Bench's H100 host floor (6 ms + 60 µs/seq + 30 ns/KV token,
    tests/sim/groundtruth.py) a 7 ms TPOT SLO holds at far less load than without it, and the binding
    limit says it is the host's work (`host_overhead`), not the GPU's."""
    out = tmp_path / "p"
    floor = "host_step_ms=6&host_seq_us=60&host_kv_ns=30"
    assert slogate(["plan", str(SAMPLE), "--slo", "ttft=2,tpot=0.007", "--window", "0:60", "--candidates",
                    f"h100-sxm/llama-3-8b?tp=4,h100-sxm/llama-3-8b?tp=4&{floor}", "--out", str(out)]) == 0
    rows = {c.candidate: c for c in load(out).candidates}
    bare, floored = rows["h100-sxm/llama-3-8b?tp=4"], rows[f"h100-sxm/llama-3-8b?tp=4&{floor}"]
    assert bare.capacity_rps and bare.capacity_rps > 2 * (floored.capacity_rps or 0.0), (bare, floored)
    # what binds is named by what set the steps' length: the host floor there, the GPU's reads here
    assert floored.binding_limit == "host_overhead", floored
    assert bare.binding_limit != "host_overhead", bare
    assert "host_overhead" in capsys.readouterr().out
    assert slogate(["plan", str(SAMPLE), "--slo", "ttft=2", "--window", "0:10", "--candidates",
                    "h100-sxm/llama-3-8b?host_step_ms=-1", "--out", str(tmp_path / "q")]) == 2
    assert "'h100-sxm/llama-3-8b?host_step_ms=-1': host_step_ms=-1 must be ≥ 0" in capsys.readouterr().err


def test_a_calibrated_config_is_a_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`?config=FILE` plans the engine `slogate sim calibrate` wrote (its TOML, as `to_toml` writes it): a
    server that runs one request at a time with a known step model. Its capacity is one request per
    request's E2E (evenly spaced arrivals: below that rate nothing queues, above it the queue grows),
    with the E2E from the same coefficients simulated alone; the bare H100 plans far more."""
    from slogate.replay.sim.calibrate import Calibration, to_toml
    from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
    from slogate.replay.sim.steptime import LinearCoefficients
    from slogate.replay.target import sim_config
    from tests.replay.test_compare_runs import IN_TOKENS, OUT_TOKENS

    coef = LinearCoefficients(a_ms=20.0, b_ms=0.5, c_ms=0.0, d_ms=0.01)
    toml = tmp_path / "calibrated.toml"
    toml.write_text(to_toml(Calibration(linear=coef, ttft_overhead_ms=0.0, max_num_seqs=1, samples=[]), "http://x"))
    alone = simulate([SimRequest(arrival=0.0, prompt_tokens=IN_TOKENS, output_tokens=OUT_TOKENS)],
                     SimConfig(timing="linear", linear=coef, jitter=0.0, max_num_seqs=1))[0]
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=5, seconds=20)
    out = tmp_path / "p"
    assert slogate(["plan", str(trace), "--slo", "ttft=1", "--attainment", "0.9", "--candidates",
                    f"h100-sxm/llama-3-8b?config={toml},h100-sxm/llama-3-8b?max_num_seqs={MAX_SEQS}",
                    "--out", str(out), "--jobs", "1"]) == 0
    rows = {c.candidate: c for c in load(out).candidates}
    calibrated = rows[f"h100-sxm/llama-3-8b?config={toml}"]
    assert calibrated.capacity_rps == pytest.approx(1 / alone.e2e, rel=0.10), (calibrated, alone.e2e)
    assert calibrated.max_num_seqs == 1 and calibrated.binding_limit == "scheduler:max_num_seqs"  # the file's one seat
    # a replay's `sim:GPU/MODEL?config=FILE` target: the same engine (slogate sim's own flag parsing)
    engine = sim_config({"gpu": "h100-sxm", "model": "llama-3-8b", "config": str(toml)})
    assert engine.timing == "linear" and engine.linear == coef and engine.max_num_seqs == 1
    assert rows[f"h100-sxm/llama-3-8b?max_num_seqs={MAX_SEQS}"].capacity_rps > 3 * calibrated.capacity_rps
    capsys.readouterr()
    assert slogate(["plan", str(trace), "--slo", "ttft=1", "--candidates",
                    f"h100-sxm/llama-3-8b?config={tmp_path / 'missing.toml'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot use --config" in err and "missing.toml" in err and len(err.splitlines()) == 1
