"""A sweep's curve and its reading: `sweep.json` schema, the knee, and the largest load whose SLO
attainment stays at or above a target (with the next bisection point for `--refine`).

Pure: no replay runs and no I/O here except `load`/`dump` (running the points is replay.cli.sweep's job).

The knee, precisely. Sort the points by load x (speed factor, rate or concurrency) and call T the
throughput (output tokens/s; requests/s when no output tokens) and L the p99 TTFT. For each step
from point i−1 to point i the *throughput elasticity* is
    E_i = ((T_i − T_{i−1}) / T_{i−1}) / ((x_i − x_{i−1}) / x_{i−1})
(1 = throughput grows in proportion to load, 0 = none of the extra load is served). The knee is
point i−1 for the first step with E_i < 0.5 while L_i > L_{i−1}: the last load at which more load
still bought proportionally more throughput, after which it mostly buys latency. No such step
means the knee is beyond the measured range (reported as none).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.replay.results import Results, read_json, write_json

SWEEP_SCHEMA_VERSION = 1
KNEE_ELASTICITY = 0.5
KNEE_RULE = (
    "knee = last point before the first step whose throughput elasticity "
    "(relative throughput gain / relative load increase) drops below 0.5 while p99 TTFT rises"
)


class SweepPoint(msgspec.Struct, omit_defaults=False):
    """One run of the sweep, reduced to the curve's numbers (the full results are in `dir`)."""

    x: float
    dir: str
    offered_rate_rps: float | None = None
    request_rate_rps: float = 0.0
    output_tokens_per_s: float = 0.0
    goodput_rps: float = 0.0
    goodput_tokens_per_s: float = 0.0
    slo_attainment: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None
    failed: int = 0
    degraded: bool = False
    refined: bool = False  # added by --refine bisection

    @property
    def throughput(self) -> float:
        return self.output_tokens_per_s if self.output_tokens_per_s > 0 else self.request_rate_rps


class Sweep(msgspec.Struct, omit_defaults=False):
    """`DIR/sweep.json`."""

    schema_version: int = SWEEP_SCHEMA_VERSION
    mode: str = "speed"  # "speed", "rate" or "concurrency": what x is
    points: list[SweepPoint] = []
    knee: float | None = None
    knee_rule: str = KNEE_RULE
    attainment_target: float = 0.9
    max_x_meeting_slo: float | None = None  # largest x with attainment ≥ target at it and every lower x
    slo: str | None = None  # the SLO attainment uses, e.g. "ttft=0.5,tpot=0.05"
    slo_ttft_s: float | None = None  # its TTFT bound (the report's SLO line)
    command: list[str] = []


def point_from_results(x: float, directory: str, results: Results, *, refined: bool = False) -> SweepPoint:
    s = results.summary
    return SweepPoint(
        x=x,
        dir=directory,
        offered_rate_rps=s.offered_rate_rps,
        request_rate_rps=s.request_rate_rps,
        output_tokens_per_s=s.output_tokens_per_s,
        goodput_rps=s.goodput_rps,
        goodput_tokens_per_s=s.goodput_tokens_per_s,
        slo_attainment=s.slo_attainment,
        ttft_p50_s=s.ttft_s.p50,
        ttft_p99_s=s.ttft_s.p99,
        tpot_p50_s=s.tpot_s.p50,
        tpot_p99_s=s.tpot_s.p99,
        e2e_p99_s=s.e2e_s.p99,
        failed=s.failed,
        degraded=s.degraded,
        refined=refined,
    )


def elasticities(points: Sequence[SweepPoint]) -> list[float | None]:
    """E_i for each step (len(points) − 1 values, in x order); None where undefined (zero baseline)."""
    pts = sorted(points, key=lambda p: p.x)
    out: list[float | None] = []
    for a, b in itertools.pairwise(pts):
        if a.throughput <= 0 or a.x <= 0 or b.x == a.x:
            out.append(None)
            continue
        out.append(((b.throughput - a.throughput) / a.throughput) / ((b.x - a.x) / a.x))
    return out


def find_knee(points: Sequence[SweepPoint], elasticity: float = KNEE_ELASTICITY) -> float | None:
    """x of the knee (see the module docstring), or None when the curve never bends in range."""
    pts = sorted(points, key=lambda p: p.x)
    for i, e in enumerate(elasticities(pts), start=1):
        if e is None or e >= elasticity:
            continue
        before, after = pts[i - 1].ttft_p99_s, pts[i].ttft_p99_s
        if before is not None and after is not None and after > before:
            return pts[i - 1].x
    return None


def max_meeting(points: Sequence[SweepPoint], target: float) -> float | None:
    """Largest x whose attainment, and that of every lower x, is ≥ target; None if the lowest fails."""
    best: float | None = None
    for p in sorted(points, key=lambda p: p.x):
        if p.slo_attainment is None or p.slo_attainment < target:
            break
        best = p.x
    return best


def next_refine_x(points: Sequence[SweepPoint], target: float) -> float | None:
    """Bisection: midpoint between the largest passing x and the next (failing) x; None when there is
    no bracket (every point passes, or the lowest already fails)."""
    pts = sorted(points, key=lambda p: p.x)
    ok = max_meeting(pts, target)
    if ok is None:
        return None
    above = [p.x for p in pts if p.x > ok]
    if not above:
        return None
    return (ok + above[0]) / 2.0


def analyze(sweep: Sweep) -> Sweep:
    """Sort the points and fill in the knee and the max x meeting the SLO attainment target."""
    sweep.points.sort(key=lambda p: p.x)
    sweep.knee = find_knee(sweep.points)
    sweep.max_x_meeting_slo = max_meeting(sweep.points, sweep.attainment_target)
    return sweep


def x_text(x: float) -> str:
    """A load as given to the replay: `2`, `0.5`, `12.5`; more digits only where 6 would change the value
    (`1.3396675240533031`, a speed copied from a plan), so two points never share a name or a load."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def point_dir_name(x: float) -> str:
    """`point-2`, `point-0.5`, `point-12.5` (no trailing zeros; stable for reruns; one per x)."""
    return f"point-{x_text(x)}"


def dump(sweep: Sweep, path: str | Path) -> None:
    write_json(sweep, path)


def load(path: str | Path) -> Sweep:
    """Read a sweep.json (a sweep directory holding one is accepted too)."""
    return read_json(path, Sweep, "sweep.json")
