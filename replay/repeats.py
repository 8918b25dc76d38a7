"""Repeated runs per side (`slogate compare --repeat N`): group N consecutive inputs into one side whose
summary is the mean of the repeats (records pooled), measure each metric's run-to-run spread and widen
every change's confidence interval by it (replay.significance), so a verdict counts run-to-run noise.

Pure functions of loaded sides (replay.compare.Side); never reads files and never prints.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from slogate.replay.compare import Side, flatten
from slogate.replay.significance import Spread, repeat_interval, spread, widest
from slogate.traces.summary import RunSummary

Intervals = dict[str, tuple[float, float]]
# the metrics whose run-to-run spread is printed (`replay --repeat`, `compare --repeat`) and reported
HEADLINE = ("output_tokens_per_s", "goodput_rps", "slo_attainment", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50",
            "tpot_s.p99", "e2e_s.p99")


class Repeated(msgspec.Struct):
    """One side of the comparison made of N repeats: the side shown (mean summary) and its repeats."""

    side: Side
    repeats: list[Side]


def group(sides: Sequence[Side], n: int) -> list[list[Side]]:
    """Consecutive groups of `n` (the caller checks that len(sides) is a multiple of n)."""
    return [list(sides[i:i + n]) for i in range(0, len(sides), n)]


def _mean(values: list[object]) -> object:
    """The element-wise mean of equal-shaped JSON trees (numbers averaged, ints rounded; other leaves
    from the first; dict keys present in some repeats count 0 where absent, when numeric)."""
    first = values[0]
    if isinstance(first, bool) or first is None or isinstance(first, str | list):
        if first is None:
            nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            return sum(nums) / len(nums) if len(nums) == len(values) else None
        return first
    if isinstance(first, int | float):
        nums = [v for v in values if isinstance(v, int | float)]
        if len(nums) != len(values):
            return None
        mean = sum(nums) / len(nums)
        return round(mean) if all(isinstance(v, int) for v in nums) else mean
    if isinstance(first, dict):
        dicts = [v if isinstance(v, dict) else {} for v in values]
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        out = {}
        for k in keys:
            present = [d[k] for d in dicts if k in d]
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)
            out[k] = _mean([d.get(k, 0) for d in dicts] if numeric else present)
        return out
    return first


def mean_summary(summaries: Sequence[RunSummary]) -> RunSummary:
    """The side's summary over its repeats: every number the mean of the repeats' (counts rounded)."""
    trees = [msgspec.to_builtins(s) for s in summaries]
    return msgspec.convert(_mean(trees), RunSummary)


def combine(repeats: Sequence[Side]) -> Repeated:
    """One side from its repeats: the first's name and environment, the mean summary, pooled records."""
    first = repeats[0]
    results = msgspec.structs.replace(first.results, summary=mean_summary([r.results.summary for r in repeats]))
    records = None
    if all(r.records for r in repeats):
        records = [rec for r in repeats for rec in r.records or ()]
    side = Side(name=first.name, source=", ".join(r.source for r in repeats), kind=first.kind, results=results,
                records=records)
    return Repeated(side=side, repeats=list(repeats))


def noise(rep: Repeated) -> dict[str, Spread]:
    """Each metric's spread over the side's repeats."""
    flats = [flatten(r.results.summary) for r in rep.repeats]
    out: dict[str, Spread] = {}
    for key in dict.fromkeys(k for f in flats for k in f):
        vals = [f.get(key) for f in flats]
        if all(v is not None for v in vals):
            s = spread([float(v) for v in vals if v is not None])
            if s is not None:
                out[key] = s
    return out


def widen(reps: Sequence[Repeated], cis: Sequence[Intervals | None]) -> list[Intervals | None]:
    """Per non-baseline side: every metric's change interval, the hull of the pooled-records bootstrap CI
    (`cis`, latency metrics) and the Welch interval of the repeats (every metric)."""
    base = [flatten(r.results.summary) for r in reps[0].repeats]
    out: list[Intervals | None] = []
    for rep, boot in zip(reps[1:], cis, strict=True):
        cand = [flatten(r.results.summary) for r in rep.repeats]
        merged: Intervals = {}
        for key in dict.fromkeys([*base[0], *cand[0]]):
            a, b = [f.get(key) for f in base], [f.get(key) for f in cand]
            rep_ci = None
            if all(v is not None for v in a + b):
                rep_ci = repeat_interval([float(v) for v in a if v is not None], [float(v) for v in b if v is not None])
            ci = widest((boot or {}).get(key), rep_ci)
            if ci is not None:
                merged[key] = ci
        out.append(merged)
    return out
