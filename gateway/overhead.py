"""Gateway overhead of one exchange: its wall time minus the waits on the upstream, plus sink work.

Every await on the upstream sits between `wait_start()` and `wait_end()`; the per-piece sink (which
runs inside those waits, from `data_received`) adds its own time to `sink_ns`. Plain increments: never
a timer, a task or a closure per request, never a clock read beyond the two per wait.
"""

from __future__ import annotations

from time import perf_counter_ns


class Overhead:
    """Accumulates upstream-wait time (`wait_ns`) and sink time inside those waits (`sink_ns`)."""

    __slots__ = ("_since", "sink_ns", "wait_ns")

    def __init__(self) -> None:
        self.wait_ns = 0  # time spent waiting on the upstream (head + body), sink time included
        self.sink_ns = 0  # gateway work done inside those waits (the per-piece sink)
        self._since = 0  # start of the open wait, 0 when none is open

    def wait_start(self) -> int:
        """An await on the upstream begins now; returns now (ns)."""
        self._since = t = perf_counter_ns()
        return t

    def wait_end(self) -> int:
        """The open wait (if any) ends now; returns now (ns)."""
        t = perf_counter_ns()
        if self._since:
            self.wait_ns += t - self._since
            self._since = 0
        return t

    def busy_ns(self, t_from: int, t_end: int) -> int:
        """Gateway time between `t_from` and `t_end`; closes a wait a failure left open (cancelled await)."""
        if self._since:
            self.wait_ns += t_end - self._since
            self._since = 0
        return max(0, (t_end - t_from) - self.wait_ns + self.sink_ns)
