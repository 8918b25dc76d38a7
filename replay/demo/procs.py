"""The demo's child processes (simulator, gateway, replay client): start, wait until ready, stop.

Each child runs in its own process group (so a replay's worker processes go with it) and gets
SIGTERM if the demo dies; `Children` stops every group it started, always, even on Ctrl-C.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from slogate.replay.child_process import group_options, stop_group
from slogate.replay.interrupt import held_then_raised
from slogate.traces.usage import UsageError

SLOGATE = [sys.executable, "-m", "slogate"]


class Child:
    """One started process (the leader of its own process group) and its log file."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name, self.proc, self.log = name, proc, log
        self.stopped = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 3) -> str:
        try:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return " | ".join(line.strip() for line in tail)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM to the group, wait up to `grace_s`, then SIGKILL whatever of the group is left."""
        if not self.stopped:
            self.stopped = True
            stop_group(self.proc, grace_s)
        return self.proc.returncode


class Children:
    """Every process the demo started; `stop_all` (also on exit of the `with` block) stops them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Child] = []

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, name: str, args: Sequence[str]) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([*SLOGATE, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    **group_options())  # type: ignore[call-overload]
        child = Child(name, proc, log)
        self.started.append(child)
        return child

    def stop(self, child: Child, grace_s: float = 10.0) -> int | None:
        with held_then_raised():
            return child.stop(grace_s)

    def stop_all(self, grace_s: float = 10.0) -> None:
        """Newest first: the replay client, then the gateway (it flushes the trace), then the simulator."""
        with held_then_raised():
            for child in reversed(self.started):
                child.stop(grace_s)


def http_get(url: str, timeout_s: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read()


def wait_ready(child: Child, url: str, timeout_s: float) -> float:
    """Poll `url` until it answers 200; return the seconds it took. A child that exits or never
    answers is a UsageError naming its log file."""
    t0 = time.monotonic()
    while True:
        if not child.alive():
            raise UsageError(f"{child.name} exited with status {child.proc.returncode} while starting: "
                             f"{child.log_tail()} (full log: {child.log})")
        try:
            http_get(url, timeout_s=1.0)
            return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() - t0 > timeout_s:
            raise UsageError(f"{child.name} did not answer {url} within {timeout_s:.0f} s (log: {child.log})")
        time.sleep(0.1)
