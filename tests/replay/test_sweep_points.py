"""`slogate sweep`'s points, through the real CLI in virtual time: a load with more than six digits
(a speed copied from plan.json) runs at that load in its own directory, non-finite loads and replay
options a sweep would drop stop it before its first point, and failed requests are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.sweep import load

AZURE = Path(__file__).resolve().parents[2] / "traces" / "samples" / "azure_conv_10min.csv"
BASE = [str(AZURE), "--window", "0:30", "--virtual", "--target", "sim:a100-80g/llama-3-8b", "--slo", "ttft=2,tpot=0.1"]


def test_a_precise_load_runs_as_given_in_its_own_directory(tmp_path: Path) -> None:
    """Loads were formatted with 6 digits: 1 and 1.0000001 both ran at speed 1 into point-1 (the second
    overwrote the first), and plan's 1.3396675240533031 ran at 1.33967."""
    out = tmp_path / "s"
    speeds = (1.0, 1.0000001, 1.3396675240533031)
    assert slogate(["sweep", *BASE, "--speeds", ",".join(map(repr, speeds)), "--out", str(out)]) == 0
    sweep = load(out)
    assert [p.x for p in sweep.points] == list(speeds)
    assert len({p.dir for p in sweep.points}) == 3
    trace_rps = sweep.points[0].offered_rate_rps
    assert trace_rps is not None
    for p in sweep.points:
        results = json.loads((out / p.dir / "results.json").read_text())
        assert results["summary"]["offered_rate_rps"] == pytest.approx(trace_rps * p.x, rel=1e-12)
        assert results["summary"]["offered_rate_rps"] == p.offered_rate_rps


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--speeds", "1,nan"], "bad --speeds '1,nan'"),
    (["--speeds", "1,inf"], "bad --speeds '1,inf'"),
    (["--rates", "1,1e400"], "bad --rates '1,1e400'"),
    (["--speeds", "1", "--repeat", "2"], "--repeat does not combine with slogate sweep"),
    (["--speeds", "1", "--stability", "10s"], "--stability does not combine with slogate sweep"),
])
def test_bad_points_and_dropped_options_stop_before_the_first_point(extra: list[str], fragment: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`nan`/`inf` failed in the replay only when their point came (after the finite points ran); `--repeat`
    and `--stability` were silently dropped (each point ran once, without a stability section)."""
    out = tmp_path / "s"
    assert slogate(["sweep", *BASE, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_failed_requests_are_counted_per_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Requests longer than max_model_len fail; their rate still counts in req/s, so the line says how many failed."""
    out = tmp_path / "s"
    args = [str(AZURE), "--window", "0:30", "--virtual", "--target", "sim:h100/llama-3-8b?max_model_len=300",
            "--slo", "ttft=2", "--speeds", "1", "--out", str(out)]
    assert slogate(["sweep", *args]) == 0
    failed = load(out).points[0].failed
    printed = capsys.readouterr().out
    assert failed > 0 and f"attainment 20.3%, {failed} failed" in printed and f"  {failed} failed" in printed
