"""Length distributions for synthetic workloads: fixed, uniform, lognormal, or a trace's empirical one.

`parse_lengths("lognormal:median=1000,sigma=0.8")` returns a seeded sampler. Pure: the only I/O is
reading the trace behind `empirical:TRACE` (through `replay.source`), once, at parse time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from slogate.replay.workload import WorkloadError

Sampler = Callable[[random.Random], int]


def parse_params(body: str, what: str) -> dict[str, float]:
    """'rate=5,cv=2' → {'rate': 5.0, 'cv': 2.0}."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        if "=" not in part:
            raise WorkloadError(f"bad {what} parameter {part!r}: expected KEY=NUMBER")
        k, v = (s.strip() for s in part.split("=", 1))
        try:
            x = float(v)
        except ValueError:
            raise WorkloadError(f"bad {what} parameter {part!r}: {v!r} is not a number") from None
        if not math.isfinite(x):  # inf sessions looped forever, nan slipped past every `<` check
            raise WorkloadError(f"bad {what} parameter {part!r}: give a finite number")
        out[k.lower()] = x
    return out


def parse_lengths(spec: str, *, what: str = "length") -> Sampler:
    """fixed:N | N | uniform:MIN,MAX | lognormal:median=M,sigma=S[,max=X] | empirical:TRACE[:input|output]."""
    kind, _, body = spec.partition(":")
    kind = kind.strip().lower()
    if kind.isdigit():  # a bare N is fixed:N (and must be a length too: "0" ran 0-token prompts and outputs)
        n = _int(kind, spec, what)
        return lambda rng: n
    if kind == "fixed":
        n = _int(body, spec, what)
        return lambda rng: n
    if kind == "uniform":
        try:
            lo, hi = (int(x) for x in body.split(","))
        except ValueError:
            raise WorkloadError(f"bad {what} {spec!r}: expected uniform:MIN,MAX") from None
        if not 1 <= lo <= hi:
            raise WorkloadError(f"bad {what} {spec!r}: need 1 ≤ MIN ≤ MAX")
        return lambda rng: rng.randint(lo, hi)
    if kind == "lognormal":
        return _lognormal(parse_params(body, what), spec, what)
    if kind == "empirical":
        return _empirical(body, spec, what)
    raise WorkloadError(f"unknown {what} distribution {spec!r}: use fixed:N, uniform:MIN,MAX, lognormal:median=N,sigma=S or empirical:TRACE")


def _lognormal(p: dict[str, float], spec: str, what: str) -> Sampler:
    """Lognormal lengths, rounded and clamped to [1, max]; bad parameters are refused, not a traceback."""
    if "median" not in p and "mean" not in p:
        raise WorkloadError(f"bad {what} {spec!r}: expected lognormal:median=N,sigma=S")
    center = p.get("median", p.get("mean", 0.0))
    sigma = p.get("sigma", 0.5)
    cap = int(p.get("max", 1 << 20))
    if center <= 0 or sigma < 0 or cap < 1:
        raise WorkloadError(f"bad {what} {spec!r}: need median (or mean) > 0, sigma ≥ 0 and max ≥ 1")
    mu = math.log(center) if "median" in p else math.log(center) - sigma * sigma / 2
    top = math.log(cap) + 1.0  # exp of a larger draw would only be clamped to cap (and may overflow a float)

    def draw(rng: random.Random) -> int:
        z = rng.normalvariate(mu, sigma)  # = rng.lognormvariate(mu, sigma) before exp: the same seeded draws
        return max(1, min(cap, round(math.exp(min(z, top)))))

    return draw


def _int(body: str, spec: str, what: str) -> int:
    try:
        n = int(body)
    except ValueError:
        raise WorkloadError(f"bad {what} {spec!r}: expected fixed:N with N a whole number of tokens") from None
    if n < 1:
        raise WorkloadError(f"bad {what} {spec!r}: N must be ≥ 1")
    return n


def _empirical(body: str, spec: str, what: str) -> Sampler:
    from slogate.replay.source import load_trace

    path, field = body, "input" if "input" in what else "output"
    for suffix in (":input", ":output"):
        if body.endswith(suffix):
            path, field = body[: -len(suffix)], suffix[1:]
    if not path:
        raise WorkloadError(f"bad {what} {spec!r}: expected empirical:TRACE_FILE")
    trace = load_trace(path)
    values = [getattr(r, f"{field}_tokens") for r in trace.records]
    data = [int(v) for v in values if v]
    if not data:
        raise WorkloadError(f"{path}: no {field} lengths to sample from")
    return lambda rng: data[rng.randrange(len(data))]
