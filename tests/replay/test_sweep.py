"""`slogate sweep`: the knee and the max rate meeting the SLO on a simulator whose capacity is known
(constant step, max_num_seqs=4, 10 output tokens → C = 4 / (10 × step) ≈ 52 req/s, see
test_compare_runs), bisection refinement, the knee rule on hand-made curves, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.sweep import Sweep, SweepPoint, find_knee, load, max_meeting, next_refine_x
from tests.replay.test_compare_runs import MAX_SEQS, OUT_TOKENS, capacity_rps, make_trace, replay_args


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_trace(tmp_path_factory.mktemp("sweep") / "trace.jsonl.zst", rate=20, seconds=10)  # 200 requests


def _rates() -> tuple[list[int], int, float]:
    cap = capacity_rps()
    rates = [round(cap * f) for f in (0.25, 0.5, 0.75, 0.9, 1.2, 1.5)]
    return rates, max(r for r in rates if r < cap), cap


def test_rate_sweep_finds_the_known_capacity(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rates, below, cap = _rates()
    out = tmp_path / "sweep"
    assert slogate(["sweep", *replay_args(trace), "--rates", ",".join(map(str, rates)), "--out", str(out)]) == 0
    sweep = load(out)
    assert sweep.mode == "rate" and sweep.slo == "ttft=0.1" and sweep.slo_ttft_s == pytest.approx(0.1)
    # Below capacity throughput follows the offered rate; above it stays at capacity while TTFT grows.
    by_x = {p.x: p for p in sweep.points}
    assert by_x[rates[1]].request_rate_rps == pytest.approx(rates[1], rel=0.05)
    assert by_x[rates[-1]].output_tokens_per_s == pytest.approx(cap * OUT_TOKENS, rel=0.05)
    assert by_x[rates[-1]].ttft_p99_s > 10 * by_x[rates[2]].ttft_p99_s
    assert sweep.knee == below  # the last rate the engine could still absorb
    assert sweep.max_x_meeting_slo == below  # and the last one meeting the SLO
    for p in sweep.points:
        assert (out / p.dir / "results.json").is_file() and (out / p.dir / "requests.jsonl.zst").is_file()
    table = capsys.readouterr().out
    assert f"knee: rate {below}" in table
    assert f"largest rate with SLO attainment ≥ 90%: rate {below}" in table


def test_refine_bisects_towards_the_capacity(trace: Path, tmp_path: Path) -> None:
    rates, below, cap = _rates()
    out = tmp_path / "refined"
    assert slogate(["sweep", *replay_args(trace), "--rates", ",".join(map(str, rates)), "--refine", "3",
                    "--out", str(out)]) == 0
    sweep = load(out)
    refined = [p.x for p in sweep.points if p.refined]
    assert len(refined) == 3 and all(below < x < rates[4] for x in refined)  # inside the first bracket
    # Three halvings of the (below, 1.2·C) bracket land the answer at the capacity.
    assert sweep.max_x_meeting_slo is not None and below < sweep.max_x_meeting_slo <= cap * 1.05
    assert all(p.slo_attainment >= 0.9 for p in sweep.points if p.x <= sweep.max_x_meeting_slo)
    assert sweep.knee is not None and below <= sweep.knee <= cap * 1.05


def test_concurrency_sweep_knee_is_max_num_seqs(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "conc"
    assert slogate(["sweep", *replay_args(trace), "--concurrency", "1,2,4,8,16", "--out", str(out)]) == 0
    sweep = load(out)
    assert sweep.knee == MAX_SEQS  # beyond 4 in flight, requests only queue
    by_x = {p.x: p for p in sweep.points}
    assert by_x[16].request_rate_rps == pytest.approx(capacity_rps(), rel=0.05)
    assert by_x[1].request_rate_rps == pytest.approx(capacity_rps(seats=1), rel=0.05)


def test_speed_sweep_scales_the_trace(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "speeds"
    assert slogate(["sweep", *replay_args(trace), "--speeds", "0.5,1,2,4", "--out", str(out)]) == 0
    sweep = load(out)
    assert sweep.mode == "speed" and [p.dir for p in sweep.points] == ["point-0.5", "point-1", "point-2", "point-4"]
    assert [p.offered_rate_rps for p in sweep.points] == pytest.approx([10, 20, 40, 80], rel=0.02)  # trace: 20 req/s
    assert sweep.knee == 2  # 40 req/s fits the ~52 req/s capacity, 80 does not


def _pt(x: float, thr: float, ttft: float, att: float = 1.0) -> SweepPoint:
    return SweepPoint(x=x, dir=f"point-{x:g}", output_tokens_per_s=thr, ttft_p99_s=ttft, slo_attainment=att)


def test_knee_rule_on_hand_made_curves() -> None:
    linear = [_pt(1, 100, 0.1), _pt(2, 200, 0.1), _pt(4, 400, 0.11)]
    assert find_knee(linear) is None  # never bends in range
    bend = [_pt(1, 100, 0.1), _pt(2, 195, 0.11), _pt(4, 250, 0.5), _pt(8, 260, 3.0)]
    assert find_knee(bend) == 2  # 2→4: +28 % throughput for +100 % load (elasticity 0.28)
    flat_latency = [_pt(1, 100, 0.1), _pt(2, 110, 0.1), _pt(4, 111, 0.1)]
    assert find_knee(flat_latency) is None  # throughput flat but latency not rising: not a knee
    pts = [_pt(1, 100, 0.1, 1.0), _pt(2, 200, 0.1, 0.95), _pt(4, 300, 1, 0.5), _pt(8, 300, 3, 0.95)]
    assert max_meeting(pts, 0.9) == 2  # 8 passes again but 4 in between does not: "stays ≥"
    assert next_refine_x(pts, 0.9) == 3
    assert max_meeting([_pt(1, 1, 1, 0.5)], 0.9) is None and next_refine_x([_pt(1, 1, 1, 0.5)], 0.9) is None
    assert Sweep(points=pts).knee is None  # analyze() fills it in, construction does not


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--speeds", "1,x"], "bad --speeds '1,x'"),
        (["--speeds", "0,1"], "positive"),
        (["--concurrency", "1.5,2"], "whole numbers"),
        (["--speeds", "1,2", "--speed", "3"], "--speed is set by the sweep itself"),
        (["--speeds", "1", "--attainment", "1.5"], "bad --attainment"),
    ],
)
def test_bad_input_is_one_line_exit_2(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      args: list[str], expected: str) -> None:
    status = slogate(["sweep", *replay_args(trace), *args, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert status == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_replay_errors_stop_the_sweep_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = slogate(["sweep", str(tmp_path / "missing.jsonl.zst"), "--target", "sim:h100-sxm/llama-3-8b", "--virtual",
                      "--speeds", "1,2", "--out", str(tmp_path / "s")])
    assert status == 2
    assert "missing.jsonl.zst" in capsys.readouterr().err
