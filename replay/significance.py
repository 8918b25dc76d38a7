"""Is a difference real? A seeded bootstrap confidence interval for the change of every latency
percentile (and mean) between two sets of per-request records, resampling each side's requests.

Pure functions of records: percentiles are `traces.metrics.percentile`'s definition (linear
interpolation, numpy's default) over the same per-request values `traces.summary.summarize` uses
(successful requests). With numpy installed (the `report` extra brings it) the resampling is
vectorized (its own seeded generator); without it, pure Python. With repeated runs per side
(`compare --repeat N`): the run-to-run noise, each metric's spread over the repeats and a Welch
interval of the change. Never reads files, never prints.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgspec

from slogate.traces.metrics import PERCENTILES, percentile
from slogate.traces.record import RequestRecord, effective_e2e, is_error

# summary metric -> the per-request value it summarizes (itl_s pools chunk gaps: no per-request value)
PER_REQUEST = {
    "ttft_s": lambda r: r.ttft,
    "tpot_s": lambda r: r.tpot,
    "e2e_s": lambda r: r.e2e,
    "effective_e2e_s": effective_e2e,
}
STATS = (*(name for name, _ in PERCENTILES), "mean")
DEFAULT_RESAMPLES = 400
DEFAULT_CONFIDENCE = 0.95


def values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    get = PER_REQUEST[metric]
    return [v for v in (get(r) for r in records if not is_error(r)) if v is not None]


def _stat(sorted_values: Sequence[float], stat: str) -> float:
    if stat == "mean":
        return math.fsum(sorted_values) / len(sorted_values)
    q = dict(PERCENTILES)[stat]
    return percentile(sorted_values, q)


def _resampled_stats(vals: list[float], stats: Sequence[str], resamples: int, rng: random.Random) -> list[list[float]]:
    """For each resample (with replacement, same size), every stat: [resample][stat]."""
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        gen = np.random.default_rng(rng.getrandbits(64))
        v = np.asarray(vals, dtype=float)
        qs = [dict(PERCENTILES)[s] for s in stats if s != "mean"]
        rows: list[list[float]] = []
        chunk = max(1, min(resamples, 2_000_000 // max(len(vals), 1)))
        for start in range(0, resamples, chunk):
            sample = v[gen.integers(0, len(vals), (min(chunk, resamples - start), len(vals)))]
            pct = np.percentile(sample, qs, axis=1, method="linear") if qs else None
            means = sample.mean(axis=1)
            for k in range(sample.shape[0]):
                it = iter(pct[:, k]) if pct is not None else iter(())
                rows.append([float(means[k]) if s == "mean" else float(next(it)) for s in stats])
        return rows
    out = []
    n = len(vals)
    for _ in range(resamples):
        sample = sorted(rng.choices(vals, k=n))
        out.append([_stat(sample, s) for s in stats])
    return out


def bootstrap_deltas(base: Sequence[RequestRecord], cand: Sequence[RequestRecord], *, seed: int = 0,
                     resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                     ) -> dict[str, tuple[float, float]]:
    """`metric.stat` -> (low, high) of the candidate − baseline change, a percentile-bootstrap interval
    at `confidence`; metrics with fewer than 2 values on a side are left out."""
    rng = random.Random(seed)
    out: dict[str, tuple[float, float]] = {}
    alpha = (1.0 - confidence) / 2.0
    for metric in PER_REQUEST:
        a, b = values(base, metric), values(cand, metric)
        if len(a) < 2 or len(b) < 2:
            continue
        sa = _resampled_stats(a, STATS, resamples, rng)
        sb = _resampled_stats(b, STATS, resamples, rng)
        for j, stat in enumerate(STATS):
            diffs = sorted(y[j] - x[j] for x, y in zip(sa, sb, strict=True))
            out[f"{metric}.{stat}"] = (percentile(diffs, 100 * alpha), percentile(diffs, 100 * (1 - alpha)))
    return out


def significant(interval: tuple[float, float] | None) -> bool | None:
    """True when the interval excludes zero (the change is larger than the run-to-run noise)."""
    if interval is None:
        return None
    low, high = interval
    return low > 0 or high < 0


# -- run-to-run noise from repeated runs (`compare --repeat N`) ---------------------------------------

# two-sided Student t quantiles at 95 % (df 1…30; beyond, the normal's 1.96 is within 2 %)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: float) -> float:
    """The 97.5 % Student t quantile (a 95 % two-sided interval) for `df` ≥ 1 degrees of freedom."""
    if df >= len(_T975):
        return 1.96 + 2.4 / df  # within 0.5 % of the exact quantile from df 30 on
    lo = max(int(df), 1)
    frac = df - lo
    hi = min(lo + 1, len(_T975))
    return _T975[lo - 1] + frac * (_T975[hi - 1] - _T975[lo - 1])


class Spread(msgspec.Struct):
    """One metric over N repeated runs of one side: the run-to-run noise."""

    n: int
    mean: float
    sd: float  # sample standard deviation (n − 1)
    cv: float | None  # sd / |mean|; None for a zero mean
    low: float  # the smallest and largest repeat
    high: float


def spread(vals: Sequence[float]) -> Spread | None:
    """The spread of one metric over repeats (None with fewer than 2 values)."""
    if len(vals) < 2:
        return None
    n = len(vals)
    mean = math.fsum(vals) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    return Spread(n=n, mean=mean, sd=sd, cv=sd / abs(mean) if mean else None, low=min(vals), high=max(vals))


def repeat_interval(base: Sequence[float], cand: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % Welch interval of mean(cand) − mean(base) from each side's repeated runs: the change that
    run-to-run noise alone would not produce. None unless both sides have ≥ 2 repeats."""
    a, b = spread(base), spread(cand)
    if a is None or b is None:
        return None
    va, vb = a.sd ** 2 / a.n, b.sd ** 2 / b.n
    diff = b.mean - a.mean
    if va + vb == 0:
        return diff, diff
    df = (va + vb) ** 2 / ((va ** 2 / (a.n - 1) if va else 0.0) + (vb ** 2 / (b.n - 1) if vb else 0.0))
    half = t975(df) * math.sqrt(va + vb)
    return diff - half, diff + half


def widest(*intervals: tuple[float, float] | None) -> tuple[float, float] | None:
    """The hull of the intervals given: a change is real only when it exceeds every kind of noise."""
    present = [i for i in intervals if i is not None]
    if not present:
        return None
    return min(i[0] for i in present), max(i[1] for i in present)
