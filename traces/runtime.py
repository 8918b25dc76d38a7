"""Process settings shared by slogate's processes: the GIL switch interval of the latency-sensitive ones
(gateway, replay senders), and the parent-death signal of the children they start. Never changes
anything else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h

# How long a thread may hold the GIL before handing it over. CPython's default (5 ms) lets a
# helper thread (the trace writer, the pacer's precise sleeper) hold the event loop off for 5 ms.
SWITCH_INTERVAL_S = 0.0005


def shorten_switch_interval() -> None:
    """Bound the GIL hand-over at SWITCH_INTERVAL_S (never lengthens a shorter interval already set)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM (a drain, a clean stop) when its parent dies, even by `kill -9`;
    if the parent is already gone, at once. Also safe between fork and exec (`preexec_fn`). Elsewhere a
    no-op."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
