"""Child processes a replay command starts (a `--serve-cmd` server, the demo's parts, a `sim:` target):
a free loopback port to give one, and stopping one's whole process group.

Never starts anything itself and never leaves a process of a stopped group running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

from slogate.traces.runtime import die_with_parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_options() -> dict[str, object]:
    """`subprocess.Popen` options for a child that leads its own process group (a terminal's Ctrl-C
    reaches only us, and we stop the child when we choose) and gets SIGTERM if we die (Linux). Start it
    from the main thread: the death signal follows the thread that started the child."""
    die: Callable[[], None] | None = die_with_parent if sys.platform == "linux" else None  # between fork and exec
    return {"process_group": 0, "preexec_fn": die}


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """SIGTERM to the group `proc` leads, wait up to `grace_s` for the leader, then SIGKILL whatever of
    the group is left (worker processes of a server, or a leader that ignored SIGTERM). The exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return proc.returncode
