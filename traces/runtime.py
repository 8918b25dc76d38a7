"""Interpreter tuning shared by slogate's latency-sensitive processes (gateway, replay senders):
the GIL switch interval. One number for every process; never changes anything else.
"""

from __future__ import annotations

import sys

# How long a thread may hold the GIL before handing it over. CPython's default (5 ms) lets a
# helper thread (the trace writer, the pacer's precise sleeper) hold the event loop off for 5 ms.
SWITCH_INTERVAL_S = 0.0005


def shorten_switch_interval() -> None:
    """Bound the GIL hand-over at SWITCH_INTERVAL_S (never lengthens a shorter interval already set)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
