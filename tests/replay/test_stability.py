"""`slogate replay … --stability WINDOW`: short real-clock runs on the sim (faults act on its wall
clock, not in virtual time). Without a fault the verdict is stable; with `--fault slowdown` (3× step
time) from halfway on, the verdict reports the trend and the progress lines show the current window
drifting; the scraped KV-cache usage is in the verdict. Server KV/memory growth calls a run unstable.
Plus the window parser's one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.progress import Progress
from slogate.replay.stability import LiveWindow, parse_window, stability
from slogate.traces.record import RequestRecord
from tests.replay.test_compare_runs import make_trace, replay

TARGET = "sim:h100-sxm/llama-3-8b?max_num_seqs=4&jitter=0"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_trace(tmp_path_factory.mktemp("stability") / "t.jsonl.zst", rate=40, seconds=6)


def run(trace: Path, out: Path, target: str, capsys: pytest.CaptureFixture[str],
        extra: tuple[str, ...] = ()) -> tuple[dict, str]:
    replay(trace, out, target=target, virtual=False, extra=["--stability", "1s", "--stability-cv", "0.05", *extra])
    printed = capsys.readouterr().out
    return json.loads((out / "stability.json").read_text()), printed


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_steady_run_is_stable(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st, printed = run(trace, tmp_path / "steady", TARGET, capsys)
    assert len(st["windows"]) == 6 and st["window_s"] == 1.0
    assert st["stable"] is True, st["verdict"]
    assert st["throughput"]["cv"] < 0.05
    assert st["verdict"].startswith("STABLE: throughput varied")
    assert f"stability: {st['verdict']}" in printed


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_slowdown_halfway_reports_the_trend(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the sim's clock starts a little before the first request: slowdown from ≈ halfway to the end
    st, printed = run(trace, tmp_path / "slow", TARGET + "&fault=slowdown=3.5:1000:3", capsys)
    assert st["stable"] is False
    first, last = st["windows"][0], st["windows"][-1]
    assert last["ttft_p99_s"] > 1.5 * first["ttft_p99_s"]
    assert st["ttft_p99"]["slope_per_h"] > 0 and st["ttft_p99"]["change"] > 0.2
    assert "UNSTABLE" in st["verdict"] and "p99 TTFT drifted +" in st["verdict"]
    assert "stability: UNSTABLE" in printed


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_live_window_and_scraped_kv_on_a_slowdown(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --quiet (stdout not a TTY: plain progress lines on stderr every 0.5 s), each line ends with
    the current 1 s window; the slowdown shows as a TTFT rise against the first window. The KV-cache
    usage scraped during the run is averaged per window and reported in the verdict."""
    out = tmp_path / "live"
    args = ["replay", str(trace), "--target", TARGET + "&fault=slowdown=3.5:1000:3", "--model", "llama-3-8b",
            "--slo", "ttft=0.5,tpot=50ms", "--seed", "1", "--stability", "1s", "--progress-interval", "0.5",
            "--scrape-metrics", "0.2", "--out", str(out)]
    assert slogate(args) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("slogate replay: progress")]
    assert len(lines) >= 6 and all(" window 1 s: " in ln and "tok/s" in ln for ln in lines), err[-2000:]
    changes = [float(m) for m in re.findall(r"TTFT p99 \d+ ms \(([-+0-9.]+) %\)", lines[-1])]
    assert changes and changes[0] > 50, lines[-1]  # the last window's p99 TTFT is far above the first's
    st = json.loads((out / "stability.json").read_text())
    kv = [w["kv_cache_usage"] for w in st["windows"]]
    assert all(v is not None and 0 < v <= 1 for v in kv), kv
    assert st["kv_cache_usage"]["mean"] == pytest.approx(sum(kv) / len(kv))
    assert "KV-cache usage" in st["verdict"] and "server memory" in st["verdict"]  # the sim exports its process memory


def _steady(n_s: int = 10) -> list[RequestRecord]:
    return [RequestRecord(t=i * 0.1, ttft=0.05, tpot=0.01, e2e=0.2, output_tokens=16) for i in range(n_s * 10)]


def test_kv_and_memory_growth_make_a_run_unstable() -> None:
    recs = _steady()
    flat = [{"t": t / 2, "kv_cache_usage": 0.3, "resident_memory_bytes": 8e9} for t in range(20)]
    assert stability(recs, 1.0, samples=flat).stable
    growing = [{"t": t / 2, "kv_cache_usage": 0.1 + 0.04 * t, "resident_memory_bytes": 8e9 * (1 + 0.02 * t)}
               for t in range(20)]
    st = stability(recs, 1.0, samples=growing)
    assert not st.stable
    assert any(r.startswith("KV-cache usage grew +") for r in st.reasons), st.reasons
    assert any(r.startswith("server memory grew +") for r in st.reasons), st.reasons
    assert st.kv_cache_usage is not None and st.kv_cache_usage.slope_per_h is not None and st.kv_cache_usage.slope_per_h > 0
    assert "server memory +" in st.verdict
    assert stability(recs, 1.0).kv_cache_usage is None  # nothing scraped: no claim either way


def test_live_window_text() -> None:
    w = LiveWindow(1.0)
    assert w.text() == "window 1 s: 0 tok/s, TTFT p99 -, TPOT p50 -"
    w.add([RequestRecord(t=i * 0.1, ttft=0.05, tpot=0.01, e2e=0.2, output_tokens=10) for i in range(20)])
    assert "TTFT p99 50 ms (+0.0 %)" in w.text()
    w.add([RequestRecord(t=2 + i * 0.1, ttft=0.1, tpot=0.02, e2e=0.2, output_tokens=10) for i in range(20)])
    text = w.text()
    assert "100 tok/s (-9.1 %)" in text and "TTFT p99 100 ms (+100.0 %)" in text and "TPOT p50 20 ms (+100.0 %)" in text
    p = Progress(40, [], None, LiveWindow(1.0))
    p.add([RequestRecord(t=0.0, ttft=0.05, tpot=0.01, e2e=0.2, output_tokens=10)])
    assert p.plain_line().endswith(p.window.text()) and " window 1 s: " in p.plain_line()


def test_one_slow_window_is_scatter_a_ramp_is_drift() -> None:
    """A window's p99 rests on its slowest requests: one slow window at the end of a steady run (+40 % fitted
    change) is scatter, not drift; TTFT rising window by window is drift."""
    def run(ttft_of_window: list[float]) -> list[RequestRecord]:
        return [RequestRecord(t=w + i * 0.025, ttft=ttft_of_window[w] * (1 + 0.01 * (i % 7)), tpot=0.01, e2e=0.2,
                              output_tokens=16) for w in range(len(ttft_of_window)) for i in range(40)]
    spike = stability(run([0.05, 0.052, 0.049, 0.051, 0.05, 0.05, 0.049, 0.051, 0.05, 0.1]), 1.0)
    assert spike.ttft_p99.change is not None and spike.ttft_p99.change > 0.2
    assert spike.ttft_p99.significant is False and spike.stable, spike.verdict
    ramp = stability(run([0.05 * 1.04 ** w for w in range(10)]), 1.0)
    assert ramp.ttft_p99.change is not None and ramp.ttft_p99.change > 0.2 and ramp.ttft_p99.significant is True
    assert not ramp.stable and "p99 TTFT drifted +" in ramp.verdict


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


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
@pytest.mark.parametrize("leak", [0, 25])
def test_server_memory_from_the_sims_metrics(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             leak: int) -> None:
    """The sim exports `process_resident_memory_bytes` (prometheus_client's process collector); the replay's
    scraper reads it and the verdict judges its growth. With the test fault `leak=25` (25 MB more resident
    memory every second, really allocated) the run is unstable for that reason; without it, memory is stable."""
    target = TARGET + (f"&fault=leak={leak}" if leak else "")
    st, _ = run(trace, tmp_path / f"leak{leak}", target, capsys, extra=("--scrape-metrics", "0.2"))
    mem = [w["resident_memory_bytes"] for w in st["windows"]]
    assert len(mem) == 6 and all(m is not None and m > 10e6 for m in mem), mem
    assert st["resident_memory"] is not None and "server memory" in st["verdict"]
    grew = [r for r in st["reasons"] if r.startswith("server memory grew +")]
    if leak:
        assert mem[-1] - mem[0] > 0.5 * leak * 1e6 * 5, mem  # ≈ 25 MB/s over the 5 s between the first and last window
        assert grew and st["stable"] is False and st["resident_memory"]["change"] > 0.05, st["verdict"]
    else:
        assert not grew and abs(st["resident_memory"]["change"]) < 0.05, st["verdict"]
        assert not any("memory" in r for r in st["reasons"])  # memory-wise stable (1 s p99 windows may jitter)
