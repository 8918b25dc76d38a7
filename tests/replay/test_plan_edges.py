"""`slogate plan` at its edges, through the real CLI: candidate options checked before the first point
(one line naming the candidate, never the simulator's usage text), `prefix_caching=false` reaching
the simulator, non-finite options, a trace with sessions, an E2E-bound miss named, and the
operating point's figures flagged when they cannot be trusted (it misses the target itself; the
sped-up trace ended before the load it offered was served)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.plan.output import load

SAMPLES = Path(__file__).resolve().parents[2] / "traces" / "samples"
AZURE = SAMPLES / "azure_conv_10min.csv"


def _plan(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "plan"
    assert slogate(["plan", *args, "--jobs", "1", "--out", str(out)]) == 0
    return json.loads((out / "plan.json").read_text())


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--candidates", "h100/llama-3-8b?tp=3"], "'h100/llama-3-8b?tp=3': tp=3 is not supported"),
    (["--candidates", "h100/llama-3-8b?gpu_memory_utilization=0"], "gpu_memory_utilization=0 must be a fraction"),
    (["--candidates", "h100/llama-3-8b?scheduler=foo"], "scheduler='foo'; use one of v1, v0"),
    (["--candidates", "h100/llama-3-8b?prefix_caching=maybe"], "prefix_caching='maybe'; use true or false"),
    (["--candidates", "h100/llama-3-8b?host_step_ms=abc"], "host_step_ms='abc' must be a number"),
    (["--candidates", "h100/llama-3-8b?seed=x"], "seed='x' must be a whole number"),
    (["--candidates", "h100/llama-3-8b?jitter=-1"], "jitter=-1 must be ≥ 0"),
    (["--candidates", "h100/llama-3-8b?tp=2&tp=4"], "tp is given twice"),
    (["--candidates", "h100/llama-3-8b?timing=foo"], "'h100/llama-3-8b?timing=foo': bad --timing 'foo'"),
    (["--candidates", "h100/llama-3-8b", "--grid", "tp=1,3"], "tp=3 is not supported"),
    (["--candidates", "h100/llama-3-8b", "--peak-window", "nan"], "bad --peak-window 'nan'"),
    (["--candidates", "h100/llama-3-8b", "--peak-window", "inf"], "bad --peak-window 'inf'"),
    (["--candidates", "h100/llama-3-8b", "--at-rate", "inf"], "bad --at-rate inf"),
    (["--candidates", "h100/llama-3-8b", "--at-rate", "nan"], "bad --at-rate nan"),
    (["--candidates", "h100/llama-3-8b", "--price", "h100=nan"], "bad --price 'h100=nan'"),
    (["--candidates", "h100/llama-3-8b", "--price", "h100=inf"], "bad --price 'h100=inf'"),
])
def test_bad_values_stop_before_planning_in_one_line(extra: list[str], fragment: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Each was a traceback after planning, the sim's whole usage text, an error naming a flag the user
    never typed after other candidates were simulated, or a value accepted (nan costs, infs windows)."""
    assert slogate(["plan", str(AZURE), "--window", "0:30", "--slo", "ttft=2", "--jobs", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and "usage:" not in err
    assert len(err.strip().splitlines()) == 1 and "plan: h100" not in err  # nothing was simulated


def test_prefix_caching_false_reaches_the_simulator(tmp_path: Path) -> None:
    """`prefix_caching` is a documented candidate option, but the sim only has --no-prefix-caching: any
    value was exit 2 with the sim's usage text. On Mooncake's shared prefixes, turning it off costs capacity."""
    plan = _plan(tmp_path, str(SAMPLES / "mooncake_conversation_10min.jsonl"), "--max-requests", "100",
                 "--slo", "ttft=30,tpot=1", "--attainment", "0.9", "--candidates", "h100/llama-3.1-8b",
                 "--grid", "prefix_caching=true,false")
    cap = {c["candidate"].rsplit("=", 1)[1]: c["capacity_rps"] for c in plan["candidates"]}
    assert cap["true"] > cap["false"] > 0


def test_a_trace_with_sessions_is_planned_at_its_recorded_times(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The agentic samples were an AttributeError traceback (replay's session options were missing)."""
    plan = _plan(tmp_path, str(SAMPLES / "agentic"), "--slo", "ttft=2,tpot=0.1", "--candidates", "h100/llama-3-8b")
    assert plan["requests"] == 12 and plan["candidates"][0]["capacity_rps"] > 0
    assert "sessions" in capsys.readouterr().err


def test_an_e2e_miss_names_its_binding_limit(tmp_path: Path) -> None:
    """With ttft=5,e2e=8 the long answers miss E2E alone (TTFT ~0.5 s): the binding limit was "–"."""
    plan = _plan(tmp_path, str(AZURE), "--window", "0:120", "--slo", "ttft=5,e2e=8", "--candidates",
                 "a100-80g/llama-3-8b")
    row = plan["candidates"][0]
    assert row["capacity_rps"] is not None
    past = next(p for p in row["points"] if p["speed"] > row["capacity_speed"] and p["speed"] != row["operating_speed"])
    assert past["slo_attainment"] < 0.99 and past["ttft_p99_s"] < 5  # TTFT never missed: E2E did
    assert row["binding_limit"] == "decode_bandwidth"


def test_an_operating_point_that_misses_the_target_says_so(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """70B over four L40S: a few of the longest prompts miss TTFT at any load, so attainment is not
    monotone near the capacity and the operating point (0.9 × capacity) simulated again misses 99 %."""
    out = tmp_path / "plan"
    assert slogate(["plan", str(AZURE), "--window", "0:120", "--slo", "ttft=2,tpot=0.1", "--candidates",
                    "l40s/llama-3-70b?tp=4", "--jobs", "1", "--out", str(out)]) == 0
    row = load(out).candidates[0]
    op = next(p for p in row.points if p.speed == row.operating_speed)
    assert op.slo_attainment is not None and op.slo_attainment < 0.99
    assert any("misses the attainment target" in w for w in row.warnings)
    assert "warning: l40s/llama-3-70b?tp=4: the operating point misses" in capsys.readouterr().out


def test_a_trace_too_short_for_the_operating_load_is_flagged(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """On two minutes of the sample the H100 is sped up 3.6×: 33 s of arrivals, and two thirds of them
    served inside it (capacity 15.3 req/s against 10.8 on the whole ten minutes, goodput 33 % low, so its
    cost read 0.417 $/M and ranked behind the L40S). The A100's 92 % is not flagged."""
    plan = _plan(tmp_path, str(AZURE), "--window", "0:120", "--slo", "ttft=2,tpot=0.1", "--candidates",
                 "h100-sxm/llama-3-8b,a100-80g/llama-3-8b")
    by = {c["candidate"]: c for c in plan["candidates"]}
    for name, flagged in (("h100-sxm/llama-3-8b", True), ("a100-80g/llama-3-8b", False)):
        row = by[name]
        op = next(p for p in row["points"] if p["speed"] == row["operating_speed"])
        served = op["request_rate_rps"] / op["offered_rps"]
        assert (served < 0.9) is flagged
        assert any("was served within the sped-up trace" in w for w in row["warnings"]) is flagged
    assert "warning: h100-sxm/llama-3-8b: at the operating point only 67%" in capsys.readouterr().out


def test_headroom_zero_reuses_the_capacity_point_and_replay_agrees(tmp_path: Path) -> None:
    """With --headroom 0 the operating point is the capacity point: it was simulated a second time and
    listed twice in plan.json's points. Its goodput is what `slogate replay --virtual` measures at that speed."""
    plan = _plan(tmp_path, str(AZURE), "--window", "0:60", "--slo", "ttft=2,tpot=0.1", "--candidates",
                 "a100-80g/llama-3-8b", "--headroom", "0", "--price", "a100-80g=1.8")
    row = plan["candidates"][0]
    speeds = [p["speed"] for p in row["points"]]
    assert row["operating_speed"] == row["capacity_speed"] and len(speeds) == len(set(speeds))
    out = tmp_path / "op"
    assert slogate(["replay", str(AZURE), "--window", "0:60", "--virtual", "--target", "sim:a100-80g/llama-3-8b",
                    "--speed", repr(row["operating_speed"]), "--slo", "ttft=2,tpot=0.1", "--endpoint", "completions",
                    "--out", str(out), "--quiet"]) == 0
    measured = json.loads((out / "results.json").read_text())["summary"]
    assert row["goodput_tokens_per_s"] == pytest.approx(measured["goodput_tokens_per_s"], rel=1e-12)
    assert row["cost_per_million_good_tokens"] == pytest.approx(1.8 / (measured["goodput_tokens_per_s"] * 3600) * 1e6)


def test_a_candidate_that_never_meets_the_slo_names_the_lowest_load_tried(tmp_path: Path) -> None:
    """TTFT 10 ms on an L4: every speed misses. The reason said 0.00390625× while the search had gone
    down to 0.0026×; it names the lowest speed simulated."""
    plan = _plan(tmp_path, str(AZURE), "--window", "0:120", "--slo", "ttft=0.01", "--candidates", "l4/llama-3-8b")
    row = plan["candidates"][0]
    lowest = min(p["speed"] for p in row["points"])
    assert row["capacity_rps"] is None and row["replicas"] is None and row["cost_per_million_good_tokens"] is None
    assert all(p["slo_attainment"] < 0.99 for p in row["points"])
    assert row["reason"] == f"misses 99.0% SLO attainment even at {lowest:.3g}× the trace's rate"
