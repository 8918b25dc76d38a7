"""`slogate demo` as a user runs it (a subprocess, short duration): exit 0, the output folder (report,
captured trace without text, a results.json per run, the baseline's sweep), the printed status lines and
comparison, the report in headless Chromium with its capacity and cost conclusions (knee, operating point,
replicas, cost per million good tokens); and Ctrl-C / SIGTERM mid-run leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import zstandard

from slogate.cli import main as slogate
from slogate.replay.results import load as load_results
from slogate.replay.sweep import load as load_sweep
from slogate.traces.reader import read_trace
from tests.replay.test_report import (
    SECTIONS,
    assert_four_sections,
    assert_self_contained,
    chromium,
    console_errors,
)
from tests.servers import REPO, SLOGATE

DEMO = [*SLOGATE, "demo", "--no-progress", "--status-every", "2s"]
RUNS = ("a100-80g", "h100-sxm", "l40s-fp8", "production-live")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
pytestmark = pytest.mark.slow  # the short demo is ~30 s: outside the fast tier (-m "not slow")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, float]:
    out = tmp_path_factory.mktemp("demo") / "out"
    t0 = time.monotonic()
    proc = subprocess.run([*DEMO, "--duration", "15", "--speed", "2", "--out", str(out)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, time.monotonic() - t0


def test_demo_writes_one_output_folder(demo: tuple[Path, str, float]) -> None:
    out, stdout, seconds = demo
    assert seconds < 60, f"the short demo took {seconds:.0f} s"
    assert (out / "report.html").stat().st_size > 10_000
    assert (out / "comparison.txt").read_text().startswith("metric")
    for name in RUNS:
        results = load_results(out / name / "results.json")
        assert results.summary.requests > 0, name
        assert (out / name / "requests.jsonl.zst").is_file()
    for name in RUNS[:3]:
        assert load_results(out / name / "results.json").environment.clock == "virtual"
    for log in ("sim", "gateway", "replay"):
        assert (out / "logs" / f"{log}.log").is_file()
    assert f"output folder: {out}" in stdout


def test_captured_trace_is_readable_and_holds_no_text(demo: tuple[Path, str, float]) -> None:
    out, _, _ = demo
    trace = read_trace(out / "capture")
    assert len(trace.records) > 0
    assert all(r.input_tokens and r.output_tokens and r.ttft is not None for r in trace.records)
    assert any(r.hash_ids for r in trace.records)  # prefix structure is there, as hashes
    # The virtual replays replayed exactly the captured requests.
    assert load_results(out / "a100-80g" / "results.json").summary.requests == len(trace.records)
    segments = sorted((out / "capture").glob("*.jsonl.zst"))
    assert segments
    for seg in segments:
        with seg.open("rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
        text = raw.decode()
        assert '"content"' not in text and '"messages"' not in text and '"prompt"' not in text
        # synthesized prompts are runs of English words (replay.prompts.WORDS): none may appear
        assert not re.search(r"(?:\b[a-z]+ ){3}[a-z]+\b", text), re.search(r"(?:\b[a-z]+ ){3}[a-z]+\b", text)


def test_prints_live_status_and_the_comparison(demo: tuple[Path, str, float]) -> None:
    _, stdout, _ = demo
    for step in ("step 1/4", "step 2/4", "step 3/4", "step 4/4"):
        assert step in stdout
    status = re.findall(r"^\s+\[\s*\d+s\] .*req/s .*goodput .*attainment .*p99 TTFT .*ms", stdout, re.M)
    assert len(status) >= 3, stdout[:3000]
    table = stdout[stdout.index("metric "):]
    header = table.splitlines()[0]
    for name in ("a100-80g (baseline)", "h100-sxm", "l40s-fp8", "production"):
        assert name in header
    for row in ("goodput_rps", "slo_attainment", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99",
                "output_tokens_per_s"):
        assert re.search(rf"^{re.escape(row)}\s+\S", table, re.M), row
    # The method check the README describes: the capture replayed on the same simulated GPU gives what the
    # gateway measured live. In-window throughput needs the capture's chunk times for this (without them it
    # read 10 % above the replay in this overload).
    for row in ("request_rate_rps", "output_tokens_per_s", "goodput_rps", "slo_attainment"):
        line = next(x for x in table.splitlines() if x.startswith(row + " "))
        assert abs(float(line.split()[-1].rstrip("%"))) <= 1.0, line  # production's Δ% from the baseline


def test_demo_report_renders_in_chromium(demo: tuple[Path, str, float], tmp_path: Path) -> None:
    out, _, _ = demo
    dom = chromium("--dump-dom", (out / "report.html").as_uri(), tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for sid in SECTIONS:
        assert re.search(rf'<section id="{sid}"><h2>[^<]+</h2><p class="how">How to read this:', dom.stdout), sid
    for name in RUNS:
        assert name in dom.stdout
    assert not console_errors(dom.stderr), console_errors(dom.stderr)


def test_demo_report_states_capacity_replicas_and_cost(demo: tuple[Path, str, float], tmp_path: Path) -> None:
    out, _, _ = demo
    sweep = load_sweep(out / "sweep-a100-80g" / "sweep.json")
    assert len(sweep.points) >= 5 and sweep.mode == "speed"
    assert sweep.max_x_meeting_slo is not None and sweep.knee is not None  # the range crosses the SLO
    best = next(p for p in sweep.points if p.x == sweep.max_x_meeting_slo)
    assert any(p.slo_attainment is not None and p.slo_attainment < sweep.attainment_target for p in sweep.points)
    conclusions = json.loads((out / "conclusions.json").read_text())["conclusions"]
    (cap,) = [c for c in conclusions if c["topic"] == "capacity"]
    v = cap["values"]
    assert v["max_meeting_slo"] == sweep.max_x_meeting_slo and v["knee"] == sweep.knee
    assert v["recommended"] == pytest.approx(0.9 * best.x)
    assert best.offered_rate_rps and v["operating_rps"] == pytest.approx(0.9 * best.offered_rate_rps)  # as plan's
    assert v["load_run"] == "a100-80g" and v["peak_rps"] > 0
    assert v["replicas"] >= v["peak_rps"] / v["operating_rps"] > v["replicas"] - 1
    assert v["cost_per_hour_usd"] == 1.8 and v["goodput_cost_per_million_output_tokens"] > 0
    for words in ("recommended ≤", "operating point", "knee", "replica", "per million good output tokens"):
        assert words in cap["text"], words
    costs = {c["run"]: c["values"] for c in conclusions if c["topic"] == "cost"}
    assert {k: c["cost_per_hour_usd"] for k, c in costs.items()} == {
        "a100-80g": 1.8, "h100-sxm": 3.0, "l40s-fp8": 1.2, "production-live": 1.8}
    assert all(c["goodput_cost_per_million_output_tokens"] > 0 for c in costs.values())
    assert load_results(out / "h100-sxm" / "results.json").summary.cost_per_hour_usd == 3.0

    dom = chromium("--dump-dom", (out / "report.html").as_uri(), tmp=tmp_path).stdout
    section = dom[dom.index('<section id="conclusions">'):]
    section = section[:section.index("</section>")]
    assert cap["text"] in section.replace("&amp;", "&")
    assert 'href="#sweep-sweep-a100-80g"' in section and 'id="sweep-sweep-a100-80g"' in dom
    shot = tmp_path / "demo-report.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1280,4000", (out / "report.html").as_uri(), tmp=tmp_path)
    assert res.returncode == 0 and shot.stat().st_size > 10_000
    assert not console_errors(res.stderr), console_errors(res.stderr)


def test_demo_says_what_binds_from_the_sims_telemetry(demo: tuple[Path, str, float]) -> None:
    """Virtual-time runs record the simulated engine's queue, running batch and KV usage (metrics.jsonl,
    `source` sim-virtual); "what binds" rests on the most loaded sweep point's samples and says so."""
    out, _, _ = demo
    sweep = load_sweep(out / "sweep-a100-80g" / "sweep.json")
    top = max(sweep.points, key=lambda p: p.x)
    lines = [json.loads(x) for x in (out / "sweep-a100-80g" / top.dir / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(x["source"] == "sim-virtual" for x in lines)
    assert max(x["metrics"]["waiting"] for x in lines) > 0  # past the capacity requests queue
    conclusions = json.loads((out / "conclusions.json").read_text())["conclusions"]
    (binding,) = [c for c in conclusions if c["topic"] == "binding"]
    v = binding["values"]
    assert v["telemetry_source"] == "sim-virtual" and binding["run"].endswith(f"speed={top.x:g}"), binding
    assert v["limit"] in ("kv_capacity", "scheduler:max_num_seqs", "prefill_compute", "decode_bandwidth")
    assert v["waiting"] == max(x["metrics"]["waiting"] for x in lines) and v["limit"] != "decode_bandwidth"
    assert "server telemetry from the simulated engine, sampled in virtual time" in binding["text"]
    assert "client view" not in binding["text"]


def test_demo_price_and_sweep_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["demo", "--out", str(tmp_path / "o"), "--price", "a100-80g"]) == 2
    assert "bad --price 'a100-80g'" in capsys.readouterr().err
    assert slogate(["demo", "--out", str(tmp_path / "o"), "--sweep-speeds", "1,fast"]) == 2
    err = capsys.readouterr().err
    assert "bad --sweep-speeds '1,fast'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


# -- Ctrl-C / SIGTERM --------------------------------------------------------------------------------


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ignore_sigint() -> None:  # runs in the child before exec: as a script's `slogate demo &` starts it
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# Ctrl-C, SIGTERM, and Ctrl-C to a process started with SIGINT ignored (a non-interactive shell's `&`):
# (signal, exit status, the word the command prints, started ignoring SIGINT)
SIGNAL_CASES = pytest.mark.parametrize(("sig", "status", "word", "started_ignoring"),
                                       [(signal.SIGINT, 130, "interrupted", False),
                                        (signal.SIGTERM, 143, "terminated", False),
                                        (signal.SIGINT, 130, "interrupted", True)],
                                       ids=["SIGINT", "SIGTERM", "SIGINT-inherited-ignored"])


@SIGNAL_CASES
def test_signal_mid_run_stops_every_process(tmp_path: Path, sig: int, status: int, word: str,
                                            started_ignoring: bool) -> None:
    """Also when the demo was started with SIGINT ignored (a non-interactive shell's `&` does that): it
    handles SIGINT itself, as the replay client and the gateway do."""
    proc = subprocess.Popen([*DEMO, "--duration", "60", "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV, start_new_session=True,
                            preexec_fn=ignore_sigint if started_ignoring else None)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the live replay is running and reporting
            line = proc.stdout.readline()
            lines.append(line)
            if re.match(r"^\s+\[\s*\d+s\] ", line) or not line:
                break
        text = "".join(lines)
        assert re.search(r"^\s+\[\s*\d+s\] ", text, re.M), text
        ports = [int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)", text.split("step 2/4")[0])]
        assert len(set(ports)) == 3 and all(port_open(p) for p in ports), text  # sim, gateway, its admin listener
        started = descendants(proc.pid)
        assert len(started) >= 3, started  # sim, gateway, replay client (+ its workers)

        proc.send_signal(sig)
        assert proc.wait(timeout=40) == status
        assert word in proc.stderr.read()  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while any(running(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in started if running(p)], "left running: " + subprocess.run(
            ["ps", "-o", "pid,pgid,stat,args", "-p", ",".join(map(str, started))], capture_output=True, text=True).stdout
        assert not any(port_open(p) for p in ports)
        # nothing is left in the demo's own process group or in any group it created
        for pgid in {proc.pid, *started}:
            ps = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True).stdout
            assert not [row for row in ps.splitlines() if "Z" not in row.split()[1]], (pgid, ps)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- flags and errors --------------------------------------------------------------------------------


def test_help_explains_steps_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        slogate(["demo", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for word in ("1. start", "2. replay", "3. take", "4. print", "--duration", "--speed", "--out", "--gpu-baseline",
                 "--candidates", "--quiet", "--no-progress", "Ctrl-C"):
        assert word in text, word


@pytest.mark.parametrize(("args", "message"), [
    (["--candidates", "x100"], "unknown GPU 'x100'"),
    (["--gpu-baseline", "l40s?dtype=fp9"], "unknown dtype 'fp9'"),
    (["--speed", "0"], "--speed must be positive"),
    (["--duration", "soon"], "bad duration 'soon'"),
    (["--slo", "ttft=fast"], "ttft"),
    (["--trace", "/nonexistent/trace.csv"], "no such file"),
])
def test_bad_flags_are_one_line_exit_2(args: list[str], message: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["demo", "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


def test_demo_report_has_the_four_sections_filled(demo: tuple[Path, str, float], tmp_path: Path) -> None:
    """`make demo` → `slogate demo` (short): environment filled for the sims ("not recorded" where
    nothing said), load histograms, conclusions with capacity, binding and cost; Chromium renders it
    with no console errors; screenshots in this test's tmp dir."""
    out, _, _ = demo  # the module's one demo run (it is the same command)
    page = out / "report.html"
    html = page.read_text()
    assert_self_contained(html)
    env = html[html.index('<section id="environment">'):html.index('<section id="load">')]
    for value in ("A100-80G", "H100-SXM", "L40S", "slogate-sim", "80 GiB", "sim config"):
        assert value in env, value
    assert "not recorded" in env  # driver / CUDA: nobody says
    load = html[html.index('<section id="load">'):html.index('<section id="metrics">')]
    assert load.count('<img src="data:image/png;base64,') >= 3  # arrivals + length histograms per run
    topics = [c["topic"] for c in json.loads((out / "conclusions.json").read_text())["conclusions"]]
    assert {"capacity", "binding", "cost", "trust"} <= set(topics)
    dom = chromium("--dump-dom", page.as_uri(), tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert_four_sections(dom.stdout)
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    for width, height, name in ((1280, 6000, "demo-report.png"), (390, 4000, "demo-report-phone.png")):
        shot = tmp_path / name
        res = chromium(f"--screenshot={shot}", f"--window-size={width},{height}", page.as_uri(), tmp=tmp_path)
        assert res.returncode == 0 and shot.stat().st_size > 30_000, res.stderr[-2000:]
        assert not console_errors(res.stderr), console_errors(res.stderr)
