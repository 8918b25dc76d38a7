"""What makes a trace's records wrong: bad values and an implausible arrival, one line each.

The one list of problems behind `slogate trace validate` (every check) and the replay's and plan's
trace loader (the schedule's checks: times and token counts, which would otherwise be replayed as
something else). Pure: never reads a file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slogate.traces.record import RequestRecord
from slogate.traces.stats import MAX_SPAN_S, implausible_arrival, span_text

MAX_PROBLEMS = 10
_TOKENS = ("input_tokens", "output_tokens", "max_tokens")
_TIMES = ("ttft", "tpot", "e2e", "ttfb", "queue")


def problems(records: Sequence[RequestRecord], *, measured: bool = True, limit: int = MAX_PROBLEMS) -> list[str]:
    """Up to `limit` problems, `record N: …`. `measured=False` checks only what a replay schedules from
    (arrival times and token counts), not the recorded latencies and statuses."""
    out: list[str] = []
    for i, r in enumerate(records):
        bad = []
        if not math.isfinite(r.t) or r.t < 0:
            bad.append(f"t={r.t}")
        if r.think is not None and not (math.isfinite(r.think) and r.think >= 0):  # a session's think time
            bad.append(f"think={r.think}")
        elif r.think is not None and r.think > MAX_SPAN_S:  # a replay would wait that long for the next turn
            bad.append(f"think={r.think:g} s ({span_text(r.think)}: a think time in ms read as s?)")
        bad += [f"{name}={v}" for name in _TOKENS if (v := getattr(r, name)) is not None and v < 0]
        if measured:
            bad += [f"{name}={v}" for name in _TIMES
                    if (v := getattr(r, name)) is not None and not (math.isfinite(v) and v >= 0)]
            if not (100 <= r.status <= 599 or (r.status == 0 and r.error)):  # 0: no response (connect error)
                bad.append(f"status={r.status}")
        if bad:
            out.append(f"record {i + 1}: bad {', '.join(bad)}")
            if len(out) >= limit:
                return out
    far = implausible_arrival([r.t for r in records])
    if far is not None:
        i, t, first = far
        out.append(f"record {i + 1}: t={t:g} s arrives {span_text(t - first)} after the first arrival (t={first:g}): "
                   "timestamps in the wrong unit (ms read as s) or epoch times? t counts seconds from the trace's start")
    return out[:limit]
