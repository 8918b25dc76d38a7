"""Synthetic load models, one module each: constant, poisson, gamma (bursty), concurrency (closed loop),
agentic (sessions with think time, growing context and subagents).

`synthesize(spec, ...)` parses `KIND:key=value,...` and returns a `Workload`. Generators are pure
and seeded; they never send anything and never read a clock.
"""

from __future__ import annotations

import random

from slogate.replay.lengths import Sampler, parse_lengths, parse_params
from slogate.replay.workload import PlannedRequest, Workload, WorkloadError

DEFAULT_DURATION_S = 60.0


def synthesize(
    spec: str,
    *,
    input_tokens: str = "lognormal:median=512,sigma=0.6",
    output_tokens: str = "lognormal:median=128,sigma=0.6",
    requests: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
) -> Workload:
    """A synthetic workload: `poisson:rate=5`, `gamma:rate=5,cv=3`, `constant:rate=100`, `concurrency:c=8`."""
    from slogate.replay.profiles import concurrency, constant, gamma, poisson

    kind, _, body = spec.partition(":")
    kind = kind.strip().lower()
    params = parse_params(body, f"--synthetic {kind}")
    rng = random.Random(seed)
    ins = parse_lengths(input_tokens, what="input length")
    outs = parse_lengths(output_tokens, what="output length")
    if kind == "concurrency":
        return concurrency.workload(params, ins, outs, rng, requests=requests, duration_s=duration_s, spec=spec)
    if kind == "agentic":
        from slogate.replay.profiles import agentic

        return agentic.workload(params, ins, outs, rng, spec=spec)
    gens = {"poisson": poisson.arrivals, "gamma": gamma.arrivals, "constant": constant.arrivals}
    if kind not in gens:
        raise WorkloadError(f"unknown synthetic profile {kind!r}: use poisson:rate=R, gamma:rate=R,cv=C, constant:rate=R, concurrency:c=N or agentic:sessions=N,...")
    if "rate" not in params or not params["rate"] > 0:
        raise WorkloadError(f"--synthetic {spec!r} needs rate=R (requests/s, > 0)")
    if requests is None and duration_s is None:
        duration_s = DEFAULT_DURATION_S
    times = gens[kind](params, rng, requests=requests, duration_s=duration_s)
    return Workload(requests=planned(times, ins, outs, rng), source=f"synthetic:{spec}", block_size=512)


def planned(times: list[float], ins: Sampler, outs: Sampler, rng: random.Random) -> list[PlannedRequest]:
    """Requests at `times` with sampled lengths; no shared prefixes (each prompt unique)."""
    return [PlannedRequest(t=t, input_tokens=ins(rng), output_tokens=outs(rng), index=i) for i, t in enumerate(times)]


def renewal(gap: callable, *, requests: int | None, duration_s: float | None) -> list[float]:
    """Arrival times of a renewal process starting at 0, bounded by count and/or duration."""
    times: list[float] = []
    t = 0.0
    while (requests is None or len(times) < requests) and (duration_s is None or t < duration_s):
        times.append(t)
        t += gap()
    return times
