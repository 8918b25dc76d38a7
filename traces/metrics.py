"""Metric definitions, implemented once (README "Metric definitions").

Pure functions of timings and records: TPOT, the ITL summary and percentile summaries. The
gateway, the replay client and the reports all call these, so a number means the same everywhere.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

import msgspec

from slogate.traces.record import ItlSummary

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p99_9", 99.9),
)


class Summary(msgspec.Struct, omit_defaults=True):
    """Distribution summary of one metric (seconds unless the metric says otherwise)."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = None
    max: float | None = None


def tpot(e2e: float | None, ttft: float | None, output_tokens: int | None) -> float | None:
    """Time per output token after the first: (E2E − TTFT) / (output_tokens − 1); None below 2 tokens."""
    if e2e is None or ttft is None or output_tokens is None or output_tokens < 2:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method) of pre-sorted values."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty sequence")
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summarize(values: Iterable[float | None]) -> Summary:
    """p50/p90/p95/p99/p99.9/max/mean of the non-null values."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return Summary()
    out = {name: percentile(data, q) for name, q in PERCENTILES}
    return Summary(count=len(data), mean=math.fsum(data) / len(data), max=float(data[-1]), **out)


def gaps(times: Sequence[float]) -> list[float]:
    """Differences of consecutive times (inter-token gaps): `b - a` for each pair, in one C loop."""
    return list(map(operator.sub, times[1:], times[:-1]))


def itl_summary(gaps: Sequence[float]) -> ItlSummary | None:
    """Summary of one request's inter-token gaps; None when there is no gap."""
    if not gaps:
        return None
    data = sorted(gaps)
    return ItlSummary(
        count=len(data),
        mean=math.fsum(data) / len(data),
        p50=percentile(data, 50.0),
        p99=percentile(data, 99.0),
        max=float(data[-1]),
    )
