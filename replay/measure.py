"""Run-level measurements derived only from per-request records, so a merge of shards recomputes
them exactly: duration, offered and achieved send rates, schedule lag, and the `degraded` verdict.

Pure functions; never reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord
from slogate.traces.stats import arrival_rate

LAG_BOUND_S = 0.010  # lag p99 above this marks the run degraded
RATE_SHORTFALL = 0.02  # achieved send rate this far below offered marks the run degraded


def run_duration(records: Sequence[RequestRecord]) -> float:
    """From the first intended send to the last response byte (or failure)."""
    if not records:
        return 0.0
    t0 = min(r.t for r in records)
    end = max(r.t + (r.lag or 0.0) + (r.e2e or 0.0) for r in records)
    return max(end - t0, 0.0)


def offered_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests/s of the intended schedule: (n − 1) / (last − first intended time)."""
    return arrival_rate([r.t for r in records])


def send_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests/s actually sent: (n − 1) / (last − first actual send time)."""
    return arrival_rate([r.t + (r.lag or 0.0) for r in records])


def degraded_reasons(records: Sequence[RequestRecord], *, lag_bound_s: float = LAG_BOUND_S,
                     open_loop: bool = True) -> list[str]:
    """Why the client could not hold the schedule (empty when it did)."""
    reasons: list[str] = []
    lags = sorted(r.lag for r in records if r.lag is not None)
    if lags:
        p99 = percentile(lags, 99.0)
        if p99 > lag_bound_s:
            reasons.append(f"schedule lag p99 {p99 * 1e3:.1f} ms > bound {lag_bound_s * 1e3:g} ms (client could not send on time)")
    if open_loop:
        offered, sent = offered_rate(records), send_rate(records)
        if offered and sent is not None and sent < offered * (1 - RATE_SHORTFALL):
            reasons.append(f"achieved send rate {sent:.2f}/s is {100 * (1 - sent / offered):.1f} % below offered {offered:.2f}/s")
    return reasons
