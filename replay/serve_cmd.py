"""`sweep --serve-cmd`: start a server command for one grid point, wait until it answers, stop it.

Fills `{port}` and the grid's `{key}` placeholders, runs the command with its output in a log file,
polls `/v1/models` (or `/health`) until ready, and stops it with SIGTERM then SIGKILL after a grace.
Never sends load (the sweep does) and never leaves a process behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from slogate.replay.child_process import group_options, stop_group
from slogate.replay.interrupt import held_then_raised
from slogate.traces.usage import UsageError

STOP_GRACE_S = 10.0


class ServerFailed(Exception):
    """The server exited or never became ready; `tail` is the end of its log."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(message)
        self.tail = tail


def render(template: str, values: dict[str, str]) -> list[str]:
    """The command's argv with `{port}` and the grid placeholders filled in."""
    try:
        return shlex.split(template.format(**values))
    except KeyError as exc:
        raise UsageError(f"--serve-cmd uses {{{exc.args[0]}}} but no --grid {exc.args[0]}=… gives it") from None
    except (ValueError, IndexError) as exc:
        raise UsageError(f"bad --serve-cmd {template!r}: {exc}") from None


def tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _ready(url: str) -> bool:
    for path in ("/v1/models", "/health"):
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url + path, timeout=1.0) as resp:
            if resp.status == 200:
                return True
    return False


@contextlib.contextmanager
def serve(argv: list[str], port: int, log: Path, *, ready_timeout_s: float = 60.0) -> Iterator[str]:
    """Run `argv` (its own process group, SIGTERM if we die), yield its base URL once ready; always stop it."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **group_options(),  # type: ignore[call-overload]
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError as exc:
            raise ServerFailed(f"cannot start {argv[0]!r}: {exc.strerror}", "") from None
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _ready(url):
            if proc.poll() is not None:
                raise ServerFailed(f"the server exited with status {proc.returncode} before it was ready", tail(log))
            if time.monotonic() > deadline:
                raise ServerFailed(f"the server was not ready within {ready_timeout_s:g}s", tail(log))
            time.sleep(0.1)
        yield url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it after the grace. A Ctrl-C or SIGTERM meanwhile is held
    until the server is gone (then raised), so a second one cannot leave it running."""
    with held_then_raised():
        stop_group(proc, STOP_GRACE_S)
