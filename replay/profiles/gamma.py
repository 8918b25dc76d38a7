"""Gamma-renewal arrivals: a mean rate plus burstiness (vLLM's `--burstiness`: factor = 1/shape).

Gaps ~ Gamma(shape k, scale 1/(rate·k)); coefficient of variation CV = 1/√k, so burstiness = CV².
`cv=` or `burstiness=` (1 = Poisson, > 1 burstier, < 1 smoother). Pure and seeded.
"""

from __future__ import annotations

import random

from slogate.replay.profiles import renewal
from slogate.replay.workload import WorkloadError


def shape(params: dict[str, float]) -> float:
    if "cv" in params:
        if not params["cv"] > 0:
            raise WorkloadError("gamma cv must be > 0")
        return 1.0 / (params["cv"] ** 2)
    burstiness = params.get("burstiness", 1.0)
    if not burstiness > 0:
        raise WorkloadError("gamma burstiness must be > 0 (1 = Poisson)")
    return 1.0 / burstiness


def arrivals(params: dict[str, float], rng: random.Random, *, requests: int | None, duration_s: float | None) -> list[float]:
    k = shape(params)
    scale = 1.0 / (params["rate"] * k)
    return renewal(lambda: rng.gammavariate(k, scale), requests=requests, duration_s=duration_s)
