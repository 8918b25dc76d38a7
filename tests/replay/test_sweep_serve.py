"""`slogate sweep --serve-cmd … --grid …`: a 2×2 grid of `slogate sim` servers (max_num_seqs 8 and 256,
a good and an unknown GPU): four servers started and stopped with none left behind, 8 seats meet
the SLO at a lower rate than 256, the failing points are reported and the rest go on, and
`--resume` skips the points that finished."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slogate.cli import main as slogate
from slogate.replay.sweep import load
from tests.replay.test_compare_runs import make_trace
from tests.replay.test_demo import SIGNAL_CASES, ignore_sigint, running

SERVE = f"{sys.executable} -m slogate.cli sim --port {{port}} --gpu {{gpu}} --max-num-seqs {{max_num_seqs}} --jitter 0"


def _children() -> set[int]:
    """Processes whose parent is this test process."""
    me, out = os.getpid(), set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(d.name))
    return out


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_grid_of_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=5)  # 100 requests of 10 output tokens
    out = tmp_path / "grid"
    before = _children()
    args = ["sweep", str(trace), "--model", "llama-3-8b", "--slo", "ttft=0.1", "--rates", "50,400", "--quiet",
            "--serve-cmd", SERVE, "--grid", "max_num_seqs=8,256", "--grid", "gpu=h100-sxm,b200", "--out", str(out),
            "--ready-timeout", "30"]
    assert slogate(args) == 0
    assert _children() <= before  # every server stopped
    grid = json.loads((out / "grid.json").read_text())
    by = {(p["grid"]["max_num_seqs"], p["grid"]["gpu"]): p for p in grid["points"]}
    assert len(by) == 4
    for seats in ("8", "256"):
        bad = by[(seats, "b200")]
        assert bad["status"] == "failed" and "exited" in bad["error"] and "b200" in bad["log_tail"]
        assert by[(seats, "h100-sxm")]["status"] == "ok"
    small, big = load(out / by[("8", "h100-sxm")]["dir"]), load(out / by[("256", "h100-sxm")]["dir"])
    assert small.max_x_meeting_slo == 50 and big.max_x_meeting_slo == 400
    env = json.loads((out / by[("8", "h100-sxm")]["dir"] / "point-50" / "results.json").read_text())["environment"]
    assert "--max-num-seqs 8" in env["labels"]["serve_cmd"] and env["labels"]["grid.max_num_seqs"] == "8"
    capsys.readouterr()
    assert slogate([*args, "--resume"]) == 0
    text = capsys.readouterr().out
    assert text.count("skipped (--resume)") == 2 and text.count("starting") == 2  # only the failed ones again
    assert _children() <= before


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--grid", "max_num_seqs=8"], "--grid and --resume go with --serve-cmd"),
    (["--serve-cmd", "slogate sim --port {port} --max-num-seqs {seqs}"], "no --grid seqs="),
    (["--serve-cmd", "x {port}", "--grid", "seqs"], "bad --grid 'seqs'"),
    (["--serve-cmd", "x {port}", "--target", "http://h:1"], "--target is set by --serve-cmd"),
])
def test_bad_grid_options_are_one_line_errors(extra: list[str], fragment: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=1)
    assert slogate(["sweep", str(trace), "--slo", "ttft=0.1", "--rates", "5", "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1


# a server that is never ready (a model that takes minutes to load): it writes its pid and waits
SLOW_SERVER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n"


@contextlib.contextmanager
def sweep_with_a_starting_server(tmp_path: Path, **popen: Any) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`slogate sweep --serve-cmd` of a server that is never ready; yields (the sweep, the server's pid)
    once the server runs. Kills whatever is left at the end."""
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=1)
    (tmp_path / "server.py").write_text(SLOW_SERVER)
    pid_file = tmp_path / "server.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "slogate", "sweep", str(trace), "--slo", "ttft=0.1", "--rates", "5",
         "--out", str(tmp_path / "o"), "--serve-cmd", f"{sys.executable} {tmp_path / 'server.py'} {pid_file}",
         "--ready-timeout", "100"], text=True, **popen)
    server = 0
    try:
        deadline = time.monotonic() + 30
        while not server and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            server = int(pid_file.read_text() or 0) if pid_file.exists() else 0
        assert server and running(server), proc.communicate(timeout=5)
        yield proc, server
    finally:
        if proc.poll() is None:
            proc.kill()
        if server and running(server):
            os.kill(server, signal.SIGKILL)


@SIGNAL_CASES
def test_a_signal_while_the_server_starts_stops_it(tmp_path: Path, sig: int, status: int, word: str,
                                                   started_ignoring: bool) -> None:
    """SIGTERM (a CI job's timeout, `kill`) or Ctrl-C while a `--serve-cmd` server is still starting, i.e.
    between replays, where no replay handles the signal: the sweep stops the server (its own process group,
    so nothing else would) and exits 128 + the signal, also when started with SIGINT ignored."""
    with sweep_with_a_starting_server(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True,
                                      preexec_fn=ignore_sigint if started_ignoring else None) as (proc, server):
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == status, err
        assert f"slogate sweep: {word}; any server it started is stopped" in err
        assert not running(server)  # stopped (SIGTERM to its group) before the sweep exited


def test_a_killed_sweep_takes_its_server_with_it(tmp_path: Path) -> None:
    """`kill -9` of the sweep runs no handler; the server still gets SIGTERM (the parent-death signal
    it was started with) instead of holding the GPU in its own process group forever."""
    with sweep_with_a_starting_server(tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as (proc, server):
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while running(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(server)
