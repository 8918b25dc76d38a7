"""`slogate replay … --stability WINDOW`: short real-clock runs on the sim (faults act on its wall
clock, not in virtual time). Without a fault the verdict is stable; with `--fault slowdown` (3× step
time) from halfway on, the verdict reports the trend. Plus the window parser's one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.stability import parse_window, stability
from slogate.traces.record import RequestRecord
from tests.replay.test_compare_runs import make_trace, replay

TARGET = "sim:h100-sxm/llama-3-8b?max_num_seqs=4&jitter=0"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_trace(tmp_path_factory.mktemp("stability") / "t.jsonl.zst", rate=40, seconds=6)


def run(trace: Path, out: Path, target: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    replay(trace, out, target=target, virtual=False, extra=["--stability", "1s", "--stability-cv", "0.05"])
    printed = capsys.readouterr().out
    return json.loads((out / "stability.json").read_text()), printed


def test_steady_run_is_stable(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st, printed = run(trace, tmp_path / "steady", TARGET, capsys)
    assert len(st["windows"]) == 6 and st["window_s"] == 1.0
    assert st["stable"] is True, st["verdict"]
    assert st["throughput"]["cv"] < 0.05
    assert st["verdict"].startswith("STABLE: throughput varied")
    assert f"stability: {st['verdict']}" in printed


def test_slowdown_halfway_reports_the_trend(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the sim's clock starts a little before the first request: slowdown from ≈ halfway to the end
    st, printed = run(trace, tmp_path / "slow", TARGET + "&fault=slowdown=3.5:1000:3", capsys)
    assert st["stable"] is False
    first, last = st["windows"][0], st["windows"][-1]
    assert last["ttft_p99_s"] > 1.5 * first["ttft_p99_s"]
    assert st["ttft_p99"]["slope_per_h"] > 0 and st["ttft_p99"]["change"] > 0.2
    assert "UNSTABLE" in st["verdict"] and "p99 TTFT drifted +" in st["verdict"]
    assert "stability: UNSTABLE" in printed


def test_too_few_windows_is_not_called_stable() -> None:
    recs = [RequestRecord(t=i * 0.1, ttft=0.01, e2e=0.05, output_tokens=5) for i in range(20)]
    st = stability(recs, 1.0)
    assert len(st.windows) == 2 and not st.stable and "too short to judge" in st.verdict


@pytest.mark.parametrize(("text", "seconds"), [("1m", 60.0), ("30s", 30.0), ("500ms", 0.5), ("1h", 3600.0), ("2", 2.0)])
def test_window_parser(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


def test_bad_window_is_one_line_exit_2(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", str(trace), "--target", TARGET, "--virtual", "--out", str(tmp_path / "x"), "--quiet"]
    assert slogate([*args, "--stability", "soon"]) == 2
    err = capsys.readouterr().err
    assert "bad --stability 'soon'" in err and len(err.strip().splitlines()) == 1
    assert slogate([*args, "--stability", "1s", "--stability-cv", "5"]) == 2
    assert "--stability-cv" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # rejected before the run
