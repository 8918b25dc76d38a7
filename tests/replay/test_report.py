"""`slogate report`: one self-contained HTML file from real runs (one over HTTP with scraped metrics
and a price, one in virtual time) and a real sweep, opened in headless Chromium: the four sections in
order, every conclusion's figure link resolving, no console errors, no remote assets, screenshots at
desktop and phone width; conclusions.json beside it; and the tables-only fallback without matplotlib."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay import report
from slogate.replay.sweep import load as load_sweep
from tests.replay.test_compare_runs import capacity_rps, make_trace, replay, replay_args

SECTIONS = ("environment", "load", "metrics", "conclusions")
HEADINGS = ("Environment", "Load", "Metrics", "Conclusions")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
def _chromium() -> str:
    """The Debian chromium binary `make apt` installs; its absence fails the test (never skips)."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: run `make apt` (Debian package chromium)"
    return CHROMIUM


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("report")
    trace = make_trace(d / "trace.jsonl.zst", rate=20, seconds=2)
    http = replay(trace, d / "http", virtual=False, extra=["--scrape-metrics", "0.2", "--label", "gpu=H100",
                                                                "--cost-per-hour", "4"])
    virtual = replay(trace, d / "virtual", extra=["--label", "gpu=sim"])
    sweep_trace = make_trace(d / "sweep-trace.jsonl.zst", rate=20, seconds=5)
    rates = ",".join(str(round(capacity_rps() * f)) for f in (0.5, 0.9, 1.5))  # below, near, above capacity
    status = slogate(["sweep", *replay_args(sweep_trace), "--rates", rates, "--out", str(d / "sweep")])
    assert status == 0
    return {"http": http, "virtual": virtual, "sweep": d / "sweep", "root": d}


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def console_errors(stderr: str) -> list[str]:
    """Console messages (JS errors, failed loads) Chromium logs with --enable-logging=stderr."""
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line or "Uncaught" in line or "net::ERR_" in line or "Failed to load resource" in line]


def assert_self_contained(html: str) -> None:
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html), "remote asset referenced"
    assert "url(http" not in html and "@import" not in html and "<script" not in html


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_report_opens_in_chromium_with_every_section(dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert slogate(["report", str(dirs["http"]), str(dirs["virtual"]), str(dirs["sweep"]), "-o", str(out)]) == 0
    html = out.read_text()
    assert_self_contained(html)
    assert html.count('<img src="data:image/png;base64,') >= 4  # CDFs, 2+ timelines, sweep curve
    assert "target metrics (scraped" in html or "scraped" in html  # the HTTP run's metrics.jsonl

    dom = chromium("--dump-dom", out.as_uri(), tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert_four_sections(dom.stdout)
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    assert '<meta name="viewport"' in html and "@media print" in html and "@media (max-width" in html

    concl = json.loads((tmp_path / "conclusions.json").read_text())
    assert concl["report"] == "report.html"
    topics = {c["topic"] for c in concl["conclusions"]}
    assert {"capacity", "binding", "cost", "trust"} <= topics
    sweep = load_sweep(dirs["sweep"])
    capacity = next(c for c in concl["conclusions"] if c["topic"] == "capacity")
    assert f"up to rate {sweep.max_x_meeting_slo:g}" in capacity["text"] and "recommended ≤" in capacity["text"]
    cost = next(c for c in concl["conclusions"] if c["topic"] == "cost")
    assert "per million good output tokens" in cost["text"] and "$4/hour" in cost["text"]
    binding = next(c for c in concl["conclusions"] if c["topic"] == "binding")
    top = max(sweep.points, key=lambda p: p.x)  # the most loaded run: its virtual-time engine samples
    assert binding["run"] == f"sweep rate={top.x:g}" and binding["values"]["telemetry_source"] == "sim-virtual"
    assert binding["values"]["limit"] == "scheduler:max_num_seqs", binding["text"]  # 4 seats, past the capacity
    assert binding["figure"] == f"telemetry-sweep-rate-{top.x:g}" and 'id="' + binding["figure"] + '"' in html
    assert slogate(["report", str(dirs["http"]), "-o", str(tmp_path / "http.html"), "--no-plots"]) == 0
    alone = json.loads((tmp_path / "conclusions.json").read_text())["conclusions"]
    binding = next(c for c in alone if c["topic"] == "binding")
    assert binding["figure"] == "telemetry-http" and binding["values"]["telemetry_source"] == "scrape"
    assert "scraped from /metrics during the run" in binding["text"]

    for width, height, name in ((1280, 5000, "report.png"), (390, 3000, "report-phone.png")):
        shot = tmp_path / name
        res = chromium(f"--screenshot={shot}", f"--window-size={width},{height}", out.as_uri(), tmp=tmp_path)
        assert res.returncode == 0 and shot.stat().st_size > 30_000, res.stderr[-2000:]
        assert not console_errors(res.stderr), console_errors(res.stderr)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # Keep the latest screenshots where a person can look at them.
        shutil.copy(shot, dirs["root"].parent / f"slogate-{name.replace('report', 'report-screenshot')}")


def assert_four_sections(page: str) -> None:
    """Environment, Load, Metrics, Conclusions in that order, each with its how-to-read line, and every
    in-page link (the conclusions' figure links) pointing at an element that exists."""
    found = re.findall(r'<section id="([a-z]+)"><h2>([^<]+)</h2><p class="how">How to read this:', page)
    assert found == list(zip(SECTIONS, HEADINGS, strict=True)), found
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    targets = set(re.findall(r'href="#([^"]+)"', page))
    assert targets and targets <= ids, targets - ids
    concl = page[page.index('<section id="conclusions">'):]
    assert concl.count("<li") >= 3 and concl.count('href="#') >= 3


def test_console_error_detection_works(tmp_path: Path) -> None:
    """The check above would see a script error: Chromium logs console messages as CONSOLE lines."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    res = chromium("--dump-dom", bad.as_uri(), tmp=tmp_path)
    assert any("undefinedFunction" in line for line in console_errors(res.stderr)), res.stderr[-2000:]


def test_report_content_matches_the_runs(dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert slogate(["report", str(dirs["sweep"]), "-o", str(out), "--no-plots"]) == 0
    html = out.read_text()
    sweep = load_sweep(dirs["sweep"])
    assert sweep.knee is not None
    assert f"<b>knee:</b> rate {sweep.knee:g}" in html
    assert "★ knee" in html
    assert f"meets the SLO (ttft=0.1 for ≥ 90% of requests) up to rate {sweep.max_x_meeting_slo:g}" in html
    assert f'<h3 id="sweep-{dirs["sweep"].name}">' in html  # the capacity conclusion's figure
    for p in sweep.points:
        assert f"sweep rate={p.x:g}" in html  # one summary column per point
    assert "gpu=sim" not in html  # only the sweep was given


def test_tables_only_without_matplotlib(dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(report, "plots_available", lambda: False)
    out = tmp_path / "plain.html"
    assert slogate(["report", str(dirs["virtual"]), str(dirs["http"]), "-o", str(out)]) == 0
    assert "pip install slogate[report]" in capsys.readouterr().out
    html = out.read_text()
    assert "<img" not in html
    assert "plots need matplotlib: pip install slogate[report]" in html
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in html
    assert "gpu=H100" in html and "gpu=sim" in html  # environment table, both runs
    assert "ttft_s.p99" in html and "goodput_rps" in html  # the folded full summary table
    assert_four_sections(html)
    assert_self_contained(html)
    # the headline tables: throughput beside goodput, and TTFT/TPOT/ITL/E2E percentiles
    assert "<th>goodput tok/s</th>" in html and "<th>TPOT p99 (ms)</th>" in html and "<th>ITL p50 (ms)</th>" in html
    assert html.index("<details><summary>all summary metrics") > html.index('<div id="latency">')
    # the load section: peak minute, burstiness and warm-up, from the records
    load = html[html.index('<section id="load">'):html.index('<section id="metrics">')]
    assert "burstiness CV" in load and "peak minute" in load and "warm-up excluded" in load
    assert "workload: trace:" in load


def test_latency_deltas_carry_significance_marks(dirs: dict[str, Path], tmp_path: Path) -> None:
    """Two runs of the same trace on the same sim: deltas are within the bootstrap CI (marked ~)."""
    data = report.collect([dirs["virtual"], dirs["http"]])
    assert len(data.cis) == 1 and data.cis[0] is not None and "ttft_s.p99" in data.cis[0]
    html = report.build_html(data, plots=False)
    lat = html[html.index('<div id="latency">'):html.index('<div id="errors">')]
    assert re.search(r'title="95% CI of the change: [^"]+">[+-][0-9.]+%[~*]</span>', lat)


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "missing: no such file or directory" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert slogate(["report", str(tmp_path / "empty"), "-o", str(tmp_path / "x.html")]) == 2
    assert "results.json: missing" in capsys.readouterr().err
