"""Plan vs measurement: the plan's virtual-time capacity for one candidate agrees within 10 % with a
`slogate sweep` of the same trace against `slogate sim` over HTTP (real time, the sim in a child
process started by the replay), bisected to the same attainment target."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.plan.output import load as load_plan
from slogate.replay.sweep import load as load_sweep
from tests.replay.test_compare_runs import make_trace, sim_target

RATE = 20.0


@pytest.mark.slow
def test_plan_capacity_matches_a_measured_sweep(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=RATE, seconds=5)  # 100 requests
    target = sim_target()
    assert slogate(["plan", str(trace), "--slo", "ttft=0.1", "--attainment", "0.9",
                    "--candidates", target.removeprefix("sim:"), "--out", str(tmp_path / "plan")]) == 0
    planned = load_plan(tmp_path / "plan").candidates[0]
    assert planned.capacity_speed is not None
    lo, hi = planned.capacity_speed * 0.8, planned.capacity_speed * 1.25
    assert slogate(["sweep", str(trace), "--target", target, "--model", "llama-3-8b", "--slo", "ttft=0.1",
                    "--speeds", f"{lo:.3f},{hi:.3f}", "--attainment", "0.9", "--refine", "3",
                    "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    sweep = load_sweep(tmp_path / "sweep")
    assert sweep.max_x_meeting_slo is not None, "the measured sweep met the SLO at no speed"
    best = next(p for p in sweep.points if p.x == sweep.max_x_meeting_slo)
    measured_rps = best.offered_rate_rps
    print(f"plan {planned.capacity_rps:.2f} req/s, measured {measured_rps:.2f} req/s")
    assert planned.capacity_rps == pytest.approx(measured_rps, rel=0.10)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_compare_and_report_put_the_plan_beside_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`compare --plan` and the report: the plan's predicted capacity and knee beside a sweep of the
    same candidate (here a virtual-time sweep, so the two agree except for the sweep's coarser grid)."""
    import json

    from slogate.replay.report import collect

    trace = make_trace(tmp_path / "t.jsonl.zst", rate=RATE, seconds=5)
    target = sim_target()
    assert slogate(["plan", str(trace), "--slo", "ttft=0.1", "--attainment", "0.9",
                    "--candidates", target.removeprefix("sim:"), "--out", str(tmp_path / "plan")]) == 0
    planned = load_plan(tmp_path / "plan").candidates[0]
    assert planned.capacity_speed is not None
    speeds = [planned.capacity_speed * f for f in (0.5, 0.8, 0.97, 1.3, 2.0)]
    assert slogate(["sweep", str(trace), "--target", target, "--model", "llama-3-8b", "--slo", "ttft=0.1", "--virtual",
                    "--speeds", ",".join(f"{s:.4f}" for s in speeds), "--attainment", "0.9",
                    "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    sweep = load_sweep(tmp_path / "sweep")
    capsys.readouterr()
    assert slogate(["compare", "--plan", str(tmp_path / "plan"), str(tmp_path / "sweep"), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    measured = next(p.offered_rate_rps for p in sweep.points if p.x == sweep.max_x_meeting_slo)
    assert row["candidate"] == planned.candidate and row["measured_capacity_rps"] == pytest.approx(measured)
    assert row["predicted_capacity_rps"] == pytest.approx(planned.capacity_rps)
    assert row["capacity_error"] == pytest.approx((planned.capacity_rps - measured) / measured)
    assert 0 <= row["capacity_error"] < 0.05  # the grid's 0.97× point passed, its 1.3× point failed
    assert row["notes"] == []
    assert slogate(["compare", "--plan", str(tmp_path / "plan"), str(tmp_path / "sweep")]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"plan vs sweep: {planned.candidate}") and f"{row['capacity_error']:+.1%}" in text
    data = collect([tmp_path / "sweep", tmp_path / "plan"], with_records=False)
    assert data.sweeps[0].planned is not None
    assert data.sweeps[0].planned.capacity_error == pytest.approx(row["capacity_error"])
    assert slogate(["report", str(tmp_path / "sweep"), str(tmp_path / "plan"), "--out", str(tmp_path / "r.html")]) == 0
    assert 'id="plan-vs-sweep-sweep"' in (tmp_path / "r.html").read_text()
