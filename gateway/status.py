"""`/slogate/status` (rolling 1-minute and 5-minute windows), `/healthz` and `/readyz`.

The relay hands each finished request to `StatusWindow.add` (one small Struct appended); the figures
are computed only when `/slogate/status` is requested, by the one summary (`traces.summary`), so
they equal `results.json`, `slogate compare` and `trace stats` on the same requests. Never holds
text, headers or client addresses.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from time import perf_counter_ns

import msgspec

from slogate.traces.record import RequestRecord
from slogate.traces.slo import Slo
from slogate.traces.summary import RunSummary, Window, summarize

WINDOWS = (("1m", 60.0), ("5m", 300.0))
_MAX_ENTRIES = 1_000_000  # memory bound (~300 MB) at extreme request rates
# Failures that say the upstream cannot serve (a client's hang-up or a 4xx says nothing about it).
_UPSTREAM_DOWN = frozenset({"connect", "timeout_connect", "timeout_ttfb", "reset", "protocol"})


class StatusRow(msgspec.Struct, gc=False, array_like=True):
    """One finished request: when it finished (seconds since the gateway started, the records' time
    base) and its record without the per-chunk offsets and prefix ids (kept small)."""

    finished: float
    record: RequestRecord


class StatusWindow:
    """Finished requests of the last 5 minutes, summarized on request."""

    def __init__(self, slos: Sequence[Slo], start_ns: int | None = None) -> None:
        self.slos = list(slos)
        self.start_ns = perf_counter_ns() if start_ns is None else start_ns
        self.rows: deque[StatusRow] = deque(maxlen=_MAX_ENTRIES)
        self.total_requests = 0
        self.failing_since: float | None = None  # first upstream failure after the last success
        self.last_failure = 0.0

    def now(self) -> float:
        return (perf_counter_ns() - self.start_ns) * 1e-9

    def add(self, record: RequestRecord) -> None:
        now = self.now()
        rows = self.rows
        slim = msgspec.structs.replace(record, chunk_times=None, hash_ids=None) if (
            record.chunk_times is not None or record.hash_ids is not None) else record
        rows.append(StatusRow(now, slim))
        self.total_requests += 1
        if record.error is None:
            self.failing_since = None
        elif record.error in _UPSTREAM_DOWN or (record.error == "upstream_status" and (record.status or 0) >= 500):
            self.last_failure = now
            if self.failing_since is None:
                self.failing_since = now
        horizon = now - WINDOWS[-1][1]
        while rows[0].finished < horizon:  # lazy prune: amortized O(1)
            rows.popleft()

    def answering(self, window: float) -> bool:
        """Passive readiness: False while every request for `window` seconds failed upstream-side
        (and one did so within the last `window`); True again after a success or a quiet `window`."""
        since = self.failing_since
        if since is None:
            return True
        now = self.now()
        return now - since < window or now - self.last_failure >= window

    def snapshot(self, rows: list[StatusRow] | None = None, now: float | None = None) -> dict:
        """The status document. Pass a copy of `rows` (and `now`) to compute it off the event loop."""
        now = self.now() if now is None else now
        rows = list(self.rows) if rows is None else rows
        return {
            "uptime_s": round(now, 3),
            "requests_total": self.total_requests,
            "windows": {name: self._window(rows, now, seconds) for name, seconds in WINDOWS},
        }

    def _window(self, rows: list[StatusRow], now: float, seconds: float) -> dict:
        window = Window(max(now - seconds, 0.0), now)  # shorter while the gateway is younger than `seconds`
        records = [row.record for row in rows if row.finished >= now - seconds]
        return status_window(summarize(records, window=window, slos=self.slos), seconds, self.slos)


def status_window(s: RunSummary, seconds: float, slos: Sequence[Slo]) -> dict:
    """The JSON of one status window, from the summary of its requests."""
    doc: dict = {
        "seconds": seconds,
        "span_s": s.duration_s,
        "requests": s.requests,
        "errors": s.failed,
        "errors_by_class": s.failed_by_class,
        "request_rate": s.request_rate_rps,
        "output_tokens_per_s": s.output_tokens_per_s,
        "total_tokens_per_s": s.total_tokens_per_s,
        "samples_per_s": s.samples_per_s,
        "input_tokens_estimated": s.input_tokens_estimated,
    }
    for key, dist in (("ttft", s.ttft_s), ("tpot", s.tpot_s), ("e2e", s.e2e_s)):
        doc[key] = {"count": dist.count, "p50": dist.p50, "p90": dist.p90, "p99": dist.p99}
    doc["slos"] = {
        slo.name: {
            "spec": slo.spec(),
            "good_requests": int(g["good_requests"]),
            "goodput_requests_per_s": g["goodput_rps"],
            "goodput_tokens_per_s": g["goodput_tokens_per_s"],
            "attainment": g["slo_attainment"] if s.requests else None,
        }
        for slo in slos
        for g in (s.goodput_by_slo[slo.name],)
    }
    return doc


def health_response(ready: bool) -> tuple[int, bytes]:
    """`/healthz` is (200, ok) while the process runs; `/readyz` is 200 only with an upstream connection pool up."""
    return (200, b'{"status":"ok"}') if ready else (503, b'{"status":"not ready"}')
