"""Constant-rate arrivals: one request every 1/rate seconds, exactly (pacing benchmarks).

Pure; times are computed as i/rate (no accumulated float error); never reads a clock.
"""

from __future__ import annotations

import math
import random


def arrivals(params: dict[str, float], rng: random.Random, *, requests: int | None, duration_s: float | None) -> list[float]:
    rate = params["rate"]
    n = requests if requests is not None else math.ceil((duration_s or 0.0) * rate - 1e-9)
    if requests is not None and duration_s is not None:
        n = min(n, math.ceil(duration_s * rate - 1e-9))
    return [i / rate for i in range(n)]
