"""Live progress of a run: a rich line on a TTY, plain stderr lines every N seconds in pipelines.

Fed with record batches by the orchestrator and redrawn from its loop (never from a thread, never
on a sender's loop): rich every 0.5 s when stdout is a TTY; otherwise one plain line (rate, done,
failed, lag, ETA) every `--progress-interval` for a Job's log; with `--stability` both end with the
current window (replay.stability.LiveWindow). Off with `--quiet`; rich is imported only here, lazily.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import sys
import time
from collections.abc import Sequence

from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord, is_error
from slogate.traces.slo import Slo, is_good

WINDOW = 2000  # recent requests in the running percentiles


class Progress:
    def __init__(self, total: int, schedule: Sequence[float], slo: Slo | None, window=None):  # type: ignore[no-untyped-def]
        self.total, self.schedule, self.slo = total, sorted(schedule), slo
        self.window = window  # a replay.stability.LiveWindow (--stability) or None
        self.done = self.errors = self.good = 0
        self.ttft: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.tpot: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.lag: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.start: float | None = None
        self._live = None

    def add(self, records: Sequence[RequestRecord]) -> None:
        if self.window is not None:
            self.window.add(records)
        for r in records:
            self.done += 1
            if r.lag is not None:
                self.lag.append(r.lag)
            if is_error(r):
                self.errors += 1
                continue
            if r.ttft is not None:
                self.ttft.append(r.ttft)
            if r.tpot is not None:
                self.tpot.append(r.tpot)
            if self.slo is None or is_good(r, self.slo):
                self.good += 1

    def _text(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9) if self.start else 0.0
        sent = bisect.bisect_right(self.schedule, elapsed) if self.schedule and elapsed else self.done
        sent = max(sent, self.done)

        def pct(values: collections.deque[float], q: float) -> str:
            return f"{percentile(sorted(values), q) * 1e3:.0f}" if values else "-"

        rate = self.done / elapsed if elapsed else 0.0
        return (f"{self.done}/{self.total} done  {rate:.1f} req/s  in-flight {sent - self.done}  "
                f"TTFT p50/p99 {pct(self.ttft, 50)}/{pct(self.ttft, 99)} ms  "
                f"TPOT p50/p99 {pct(self.tpot, 50)}/{pct(self.tpot, 99)} ms  "
                f"goodput {self.good / elapsed if elapsed else 0:.2f} req/s  errors {self.errors}"
                + (f"  {self.window.text()}" if self.window is not None else ""))

    def plain_line(self) -> str:
        """One log line for pipelines: done/total, rate, failed, schedule-lag p99, ETA."""
        elapsed = max(time.perf_counter() - self.start, 1e-9) if self.start else 0.0
        rate = self.done / elapsed if elapsed else 0.0
        left = self.total - self.done
        if self.schedule and self.schedule[-1] > elapsed:  # open loop: the schedule says when it ends
            eta = f"{self.schedule[-1] - elapsed:.0f}s"
        elif rate > 0:
            eta = f"{left / rate:.0f}s" if left > 0 else "0s"
        else:
            eta = "-"
        lag = f"{percentile(sorted(self.lag), 99) * 1e3:.1f}ms" if self.lag else "-"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"slogate replay: progress done={self.done}/{self.total} ({pct:.1f}%) rate={rate:.2f}req/s "
                f"failed={self.errors} lag_p99={lag} elapsed={elapsed:.0f}s eta={eta}"
                + (f" {self.window.text()}" if self.window is not None else ""))

    async def run_plain(self, start: float, interval: float) -> None:
        """A plain line on stderr every `interval` seconds, and one at the end (until cancelled)."""
        self.start = start
        try:
            while True:
                await asyncio.sleep(interval)
                print(self.plain_line(), file=sys.stderr, flush=True)
        except asyncio.CancelledError:
            print(self.plain_line(), file=sys.stderr, flush=True)

    async def run(self, start: float, plain_interval: float | None = None) -> None:
        """Redraw until cancelled (plain lines every `plain_interval` when given)."""
        if plain_interval is not None:
            await self.run_plain(start, plain_interval)
            return
        from rich.live import Live
        from rich.text import Text

        self.start = start
        with Live(Text(self._text()), auto_refresh=False, transient=False) as live:
            try:
                while True:
                    live.update(Text(self._text()), refresh=True)
                    await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                live.update(Text(self._text()), refresh=True)
