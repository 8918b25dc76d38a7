"""Poisson arrivals: exponential gaps at a mean rate (the open-loop default of most benchmarks).

Pure and seeded; never reads a clock.
"""

from __future__ import annotations

import random

from slogate.replay.profiles import renewal


def arrivals(params: dict[str, float], rng: random.Random, *, requests: int | None, duration_s: float | None) -> list[float]:
    rate = params["rate"]
    return renewal(lambda: rng.expovariate(rate), requests=requests, duration_s=duration_s)
