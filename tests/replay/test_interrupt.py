"""Ctrl-C / SIGTERM during a live replay: real `slogate replay` processes against a real sim.

Sending stops at once, requests in flight drain for --drain-timeout and are then cancelled (status 499,
error "interrupted"), a second Ctrl-C cancels at once, the results are written as usual and marked
interrupted, the exit status is 130 / 143, and no process of the replay's group survives.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from slogate.replay.results import load
from slogate.traces import formats
from tests.servers import REPO
from tests.simserver import start_sim

RATE = 10.0  # req/s of the synthetic schedule
DURATION_S = 60  # far longer than any test: the run only ends by the signal
OUTPUT_TOKENS = 100


def replay(url: str, out: Path, *args: str, rate: float = RATE) -> subprocess.Popen[str]:
    """`slogate replay` in its own process group (like a shell job: Ctrl-C reaches the whole group)."""
    cmd = [sys.executable, "-m", "slogate", "replay", "--synthetic", f"constant:rate={rate:g}",
           "--duration", f"{DURATION_S}s", "--input-tokens", "fixed:20", "--output-tokens", f"fixed:{OUTPUT_TOKENS}",
           "--target", url, "--out", str(out), "--quiet", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def sim_gauge(url: str, name: str) -> float:
    """The sum of a metric's samples over all its label sets (0 before the first)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=2).read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+]+)", text, re.M))


def running_on(url: str) -> float:
    return sim_gauge(url, "vllm:num_requests_running")


def wait_in_flight(url: str, proc: subprocess.Popen[str], n: int, timeout_s: float = 20.0,
                   finished: int = 0) -> None:
    """Until the sim has at least `n` requests running (the replay is past its setup and sending)
    and at least `finished` requests done."""
    deadline = time.monotonic() + timeout_s
    while running_on(url) < n or sim_gauge(url, "vllm:request_success_total") < finished:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the replay never got requests in flight"
        time.sleep(0.1)


def sim_child(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> tuple[int, str]:
    """(pid, URL) of the sim a `--target sim:…` replay started, once the child exists (it may not
    listen yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ps = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
        for row in ps.splitlines():
            if " sim " in row and (m := re.search(r"--port (\d+)", row)):
                return int(row.split()[0]), f"http://127.0.0.1:{m[1]}"
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the replay started no sim"
        time.sleep(0.05)


def is_listening(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/v1/models", timeout=2).close()
    except OSError:
        return False
    return True


def pid_alive(pid: int) -> bool:
    ps = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(ps) and ps[0] != "Z"


def group_alive(pgid: int) -> list[str]:
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [row for row in ps.splitlines() if row.split()[1][0] != "Z"]


def assert_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + 5
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid), group_alive(pgid)


def finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int, str, float]:
    """(exit status, stderr, seconds from now until the process exited)."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err, time.monotonic() - t0


def check_outputs(out: Path, *, planned: int) -> tuple:
    """The normal run files, parsed; the interrupted summary's counts add up. Returns (summary, records)."""
    assert {"results.json", "requests.jsonl.zst", "summary.csv"} <= {p.name for p in out.iterdir()}
    res = load(out)
    s = res.summary
    _, records = formats.load(out / "requests.jsonl.zst")
    assert s.interrupted and "interrupted" in (out / "summary.csv").read_text().splitlines()[0]
    assert s.planned_requests == planned
    assert s.sent_requests == s.requests + s.warmup_requests == len(records) > 0
    assert s.not_sent_requests == planned - s.sent_requests > 0
    cancelled = [r for r in records if r.error == "interrupted"]
    assert s.cancelled_requests == len(cancelled) and all(r.status == 499 for r in cancelled)
    assert s.failed == len(cancelled)  # nothing else failed; cancelled requests are not successes
    for r in records:
        if r.error is None:  # completed: real timings, the whole forced output
            assert r.status == 200 and r.output_tokens == OUTPUT_TOKENS and 0 < r.ttft < r.e2e
        else:  # cancelled: what arrived until the cancel (all of it when the cancel fell between the
            # last token and the stream's end, as it did once in CI on a busy box, 2026-12-05)
            assert (r.output_tokens or 0) <= OUTPUT_TOKENS
    return s, records


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_sigint_drains_in_flight_then_cancels_and_writes_results(tmp_path: Path) -> None:
    """Each request streams for ~2 s, the drain is 1 s: some finish during it, the others are cancelled."""
    out = tmp_path / "run"
    with start_sim(timing="constant", ttft_ms=20, itl_ms=20) as sim:
        proc = replay(sim.url, out, "--drain-timeout", "1s")
        wait_in_flight(sim.url, proc, 12)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        status, err, took = finish(proc, 15)
        assert running_on(sim.url) == 0  # the cancelled requests' connections were closed
    assert status == 130, err
    assert "INTERRUPTED by SIGINT" in err and took < 6, (took, err)
    s, records = check_outputs(out, planned=int(RATE * DURATION_S))
    assert 0 < s.cancelled_requests < s.sent_requests, s  # some completed within the drain, some did not
    completed = [r for r in records if r.error is None]
    assert all(r.e2e == pytest.approx(2.0, abs=0.5) for r in completed)
    assert_group_gone(proc.pid)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_second_sigint_skips_the_drain(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with start_sim(timing="constant", ttft_ms=20, itl_ms=100) as sim:  # ~10 s per request
        proc = replay(sim.url, out, "--drain-timeout", "60s")
        wait_in_flight(sim.url, proc, 5)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        status, err, took = finish(proc, 15)
    assert status == 130, err
    assert "cancelling the requests in flight" in err and took < 5, (took, err)
    s, _ = check_outputs(out, planned=int(RATE * DURATION_S))
    assert s.cancelled_requests == s.sent_requests  # none could finish: all in flight were cancelled
    assert_group_gone(proc.pid)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_worker_processes_stop_and_hand_back(tmp_path: Path, sig: signal.Signals, expected: int) -> None:
    """--workers 2: the signal reaches every process of the group; the workers leave it to the
    orchestrator, drain, cancel and hand back their records; none is left running."""
    out = tmp_path / "run"
    rate = 20.0
    with start_sim(timing="constant", ttft_ms=20, itl_ms=20) as sim:
        proc = replay(sim.url, out, "--workers", "2", "--drain-timeout", "1s", rate=rate)
        # a request takes ~2 s: once one has finished, some are done and the newest cannot finish in the drain
        wait_in_flight(sim.url, proc, 20, timeout_s=40, finished=1)
        assert len(group_alive(proc.pid)) >= 3  # the orchestrator and its two workers
        os.killpg(proc.pid, sig)
        status, err, took = finish(proc, 15)
    assert status == expected, err
    assert f"INTERRUPTED by {sig.name}" in err and took < 8, (took, err)
    s, records = check_outputs(out, planned=int(rate * DURATION_S))
    assert load(out).environment.workers == 2
    # the schedule is split round-robin: both workers' requests came back, with no gap before the stop
    index = sorted(round(r.t * rate) for r in records)
    assert index[: len(index) - 2] == list(range(len(index) - 2)), index
    assert {i % 2 for i in index} == {0, 1}
    assert s.cancelled_requests > 0 and s.sent_requests > s.cancelled_requests
    assert_group_gone(proc.pid)


def test_sigint_while_the_sim_target_starts_stops_it_at_once(tmp_path: Path) -> None:
    """`--target sim:…` starts a sim child; Ctrl-C during its startup ends the run at once: nothing
    was sent, nothing is written, exit 130, and the sim child is gone too."""
    out = tmp_path / "run"
    proc = replay("sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=20&itl_ms=20", out)
    sim_pid, _ = sim_child(proc)  # the sim child exists but is still importing: well before it listens
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGINT)
    status, err, took = finish(proc, 15)
    assert status == 130, err
    assert took < 3, f"took {took:.1f}s to stop"
    assert not out.exists() or not any(out.iterdir())
    assert_group_gone(proc.pid)
    assert not pid_alive(sim_pid)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_ctrl_c_reaches_the_replay_not_its_sim_target(tmp_path: Path) -> None:
    """A terminal's Ctrl-C goes to the replay's whole process group. The `--target sim:…` child leads a
    group of its own, so it keeps serving the requests in flight while the replay drains them (it died
    with the same SIGINT before: half the requests in flight failed with a stream error), and the
    replay stops it afterwards."""
    out = tmp_path / "run"
    proc = replay("sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=20&itl_ms=20", out, "--drain-timeout", "10s")
    sim_pid, url = sim_child(proc)
    deadline = time.monotonic() + 20
    while not is_listening(url):
        assert proc.poll() is None and time.monotonic() < deadline, "the sim never listened"
        time.sleep(0.05)
    wait_in_flight(url, proc, 12)
    os.killpg(proc.pid, signal.SIGINT)
    status, err, _ = finish(proc, 20)
    assert status == 130, err
    s, records = check_outputs(out, planned=int(RATE * DURATION_S))
    assert s.sent_requests >= 12 and s.failed == 0 and s.cancelled_requests == 0, s
    assert all(r.error is None and r.output_tokens == OUTPUT_TOKENS for r in records)
    assert not pid_alive(sim_pid)
    assert_group_gone(proc.pid)
