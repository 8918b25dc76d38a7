"""Live progress of a run on the terminal (rich): done/total, rates, in-flight, TTFT/TPOT, goodput, errors.

Fed with record batches by the orchestrator and redrawn from its loop every 0.5 s (never from a
thread, never on a sender's loop). Off when stdout is not a TTY or with `--quiet`; rich is
imported only here, lazily.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence

from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord, is_error
from slogate.traces.slo import Slo, is_good

WINDOW = 2000  # recent requests in the running percentiles


class Progress:
    def __init__(self, total: int, schedule: Sequence[float], slo: Slo | None):
        self.total, self.schedule, self.slo = total, sorted(schedule), slo
        self.done = self.errors = self.good = 0
        self.ttft: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.tpot: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.start: float | None = None
        self._live = None

    def add(self, records: Sequence[RequestRecord]) -> None:
        for r in records:
            self.done += 1
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
        import bisect

        sent = bisect.bisect_right(self.schedule, elapsed) if self.schedule and elapsed else self.done
        sent = max(sent, self.done)

        def pct(values: collections.deque[float], q: float) -> str:
            return f"{percentile(sorted(values), q) * 1e3:.0f}" if values else "-"

        rate = self.done / elapsed if elapsed else 0.0
        return (f"{self.done}/{self.total} done  {rate:.1f} req/s  in-flight {sent - self.done}  "
                f"TTFT p50/p99 {pct(self.ttft, 50)}/{pct(self.ttft, 99)} ms  "
                f"TPOT p50/p99 {pct(self.tpot, 50)}/{pct(self.tpot, 99)} ms  "
                f"goodput {self.good / elapsed if elapsed else 0:.2f} req/s  errors {self.errors}")

    async def run(self, start: float) -> None:
        """Redraw until cancelled."""
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
