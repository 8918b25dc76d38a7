"""Replicas and cost at the operating point: the trace's busiest window, replicas for it and for a
target rate, USD per million good output tokens and per 1,000 good requests, per-GPU goodput.

Costs come from traces.summary.add_cost on the operating point's summary (one definition of cost
per good token); never simulates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import msgspec

from slogate.traces.summary import RunSummary, add_cost


class Cost(msgspec.Struct, kw_only=True):
    gpus_per_replica: int
    replicas: int | None = None  # for the trace's busiest --peak-window
    replicas_at_rate: int | None = None  # for --at-rate
    goodput_rps: float = 0.0  # per replica, at the operating point
    goodput_tokens_per_s: float = 0.0
    goodput_tokens_per_s_per_gpu: float = 0.0
    usd_per_gpu_hour: float | None = None
    cost_per_million_good_tokens: float | None = None
    cost_per_1k_good_requests: float | None = None


def peak_rate(arrivals: Sequence[float], window_s: float) -> float:
    """Requests per second in the busiest `window_s` of the arrivals (the whole trace when shorter)."""
    times = sorted(arrivals)
    if not times:
        return 0.0
    span = times[-1] - times[0]
    if span <= window_s:
        return len(times) / span if span > 0 else float(len(times))  # a trace shorter than the window: its rate
    best = 0
    for i, t in enumerate(times):
        best = max(best, bisect.bisect_left(times, t + window_s, lo=i) - i)
    return best / window_s


def replicas_for(rate_rps: float, operating_rps: float | None) -> int | None:
    if operating_rps is None or operating_rps <= 0:
        return None
    return max(1, math.ceil(rate_rps / operating_rps - 1e-9))


def cost(summary: RunSummary | None, *, gpus_per_replica: int, operating_rps: float | None, peak_rps: float,
         at_rate_rps: float | None, usd_per_gpu_hour: float | None) -> Cost:
    """The cost row of one candidate whose operating point was simulated into `summary`."""
    out = Cost(gpus_per_replica=gpus_per_replica, usd_per_gpu_hour=usd_per_gpu_hour,
               replicas=replicas_for(peak_rps, operating_rps),
               replicas_at_rate=replicas_for(at_rate_rps, operating_rps) if at_rate_rps else None)
    if summary is None:
        return out
    out.goodput_rps = summary.goodput_rps
    out.goodput_tokens_per_s = summary.goodput_tokens_per_s
    out.goodput_tokens_per_s_per_gpu = summary.goodput_tokens_per_s / gpus_per_replica
    if usd_per_gpu_hour is not None:
        priced = msgspec.structs.replace(summary)
        add_cost(priced, usd_per_gpu_hour * gpus_per_replica)
        out.cost_per_million_good_tokens = priced.goodput_cost_per_million_output_tokens
        out.cost_per_1k_good_requests = priced.goodput_cost_per_1k_requests
    return out
