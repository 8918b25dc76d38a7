"""`/slogate/status` (rolling 1-minute and 5-minute windows), `/healthz` and `/readyz`.

The relay appends one small tuple per finished request (`StatusWindow.add`); percentiles,
throughput, goodput and SLO attainment are computed only when `/slogate/status` is requested,
with `traces.metrics.summarize`. Never holds text, headers or client addresses.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from slogate.traces.metrics import summarize
from slogate.traces.record import RequestRecord, is_error
from slogate.traces.slo import Slo

WINDOWS = (("1m", 60.0), ("5m", 300.0))
_MAX_ENTRIES = 1_000_000  # memory bound (~100 MB) at extreme request rates


class StatusWindow:
    """Finished requests of the last 5 minutes as (t, failed, goods, in, out, ttft, tpot, e2e, n_inputs)."""

    def __init__(self, slos: Sequence[Slo]) -> None:
        self.slos = list(slos)
        self.start = time.monotonic()
        self.entries: deque[tuple] = deque(maxlen=_MAX_ENTRIES)
        self.total_requests = 0

    def add(self, record: RequestRecord, goods: tuple[bool, ...]) -> None:
        now = time.monotonic()
        entries = self.entries
        entries.append((now, is_error(record), goods, record.input_tokens or 0, record.output_tokens or 0,
                        record.ttft, record.tpot, record.e2e, record.n_inputs or 0))
        self.total_requests += 1
        horizon = now - WINDOWS[-1][1]
        while entries[0][0] < horizon:  # lazy prune: amortized O(1)
            entries.popleft()

    def snapshot(self, entries: list[tuple] | None = None, now: float | None = None) -> dict:
        """The status document. Pass a copy of `entries` (and `now`) to compute it off the event loop."""
        now = time.monotonic() if now is None else now
        rows = list(self.entries) if entries is None else entries
        uptime = now - self.start
        return {
            "uptime_s": round(uptime, 3),
            "requests_total": self.total_requests,
            "windows": {name: self._window(rows, now, min(seconds, max(uptime, 1e-9)), seconds)
                        for name, seconds in WINDOWS},
        }

    def _window(self, entries: list[tuple], now: float, span: float, seconds: float) -> dict:
        rows = [e for e in entries if e[0] >= now - seconds]
        n = len(rows)
        out_tokens = sum(r[4] for r in rows)
        in_tokens = sum(r[3] for r in rows)
        window: dict = {
            "seconds": seconds,
            "span_s": span,
            "requests": n,
            "errors": sum(1 for r in rows if r[1]),
            "request_rate": n / span,
            "output_tokens_per_s": out_tokens / span,
            "total_tokens_per_s": (in_tokens + out_tokens) / span,
            "embedding_inputs_per_s": sum(r[8] for r in rows) / span,
        }
        for i, key in ((5, "ttft"), (6, "tpot"), (7, "e2e")):
            s = summarize(r[i] for r in rows)
            window[key] = {"count": s.count, "p50": s.p50, "p90": s.p90, "p99": s.p99}
        slos = {}
        for j, slo in enumerate(self.slos):
            good = [r for r in rows if r[2][j]]
            slos[slo.name] = {
                "spec": slo.spec(),
                "good_requests": len(good),
                "goodput_requests_per_s": len(good) / span,
                "goodput_tokens_per_s": sum(r[4] for r in good) / span,
                "attainment": (len(good) / n) if n else None,
            }
        window["slos"] = slos
        return window


def health_response(ready: bool) -> tuple[int, bytes]:
    """`/healthz` is (200, ok) while the process runs; `/readyz` is 200 only with an upstream connection pool up."""
    return (200, b'{"status":"ok"}') if ready else (503, b'{"status":"not ready"}')
