"""Plan vs measurement: a plan's predicted capacity and knee for one candidate beside a real sweep's
measured ones (`slogate compare --plan PLAN SWEEP`, and the report's sweep section), with the error.

Reads a plan.json and a sweep.json and matches the candidate (named, found in the sweep's command,
or the plan's only one that fits). Never simulates, never runs load, never prints.
"""

from __future__ import annotations

import msgspec

from slogate.replay.plan.planner import CandidatePlan, Plan
from slogate.replay.sweep import Sweep, SweepPoint
from slogate.traces.usage import UsageError


class PlanVsSweep(msgspec.Struct, kw_only=True, omit_defaults=False):
    """One candidate: what the simulator predicted and what the sweep measured (req/s offered)."""

    candidate: str
    predicted_capacity_rps: float | None
    measured_capacity_rps: float | None
    capacity_error: float | None  # (predicted − measured) / measured
    predicted_knee_rps: float | None
    measured_knee_rps: float | None
    knee_error: float | None
    plan_attainment: float
    sweep_attainment: float
    notes: list[str] = []


def _rel(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def find_candidate(plan: Plan, sweep: Sweep, name: str | None = None) -> CandidatePlan | None:
    """The plan's row for the sweep: `name` (its spec), else one whose `sim:` target is in the sweep's
    command, else the plan's only candidate that fits; None when none is clear."""
    if name is not None:
        row = next((c for c in plan.candidates if c.candidate == name), None)
        if row is None:
            raise UsageError(f"--candidate {name!r} is not in the plan; pick one of: "
                             + ", ".join(c.candidate for c in plan.candidates))
        return row
    words = set(sweep.command)
    for c in plan.candidates:
        if f"sim:{c.candidate}" in words or c.candidate in words:
            return c
    fitting = [c for c in plan.candidates if c.fits]
    return fitting[0] if len(fitting) == 1 else None


def _rate(sweep: Sweep, x: float | None) -> float | None:
    if x is None:
        return None
    point: SweepPoint | None = next((p for p in sweep.points if p.x == x), None)
    if point is None:
        return None
    return x if sweep.mode == "rate" else point.offered_rate_rps


def compare(plan: Plan, sweep: Sweep, row: CandidatePlan) -> PlanVsSweep:
    measured_cap = _rate(sweep, sweep.max_x_meeting_slo)
    measured_knee = _rate(sweep, sweep.knee)
    notes = []
    if abs(plan.attainment_target - sweep.attainment_target) > 1e-9:
        notes.append(f"the plan's attainment target ({plan.attainment_target:g}) differs from the sweep's "
                     f"({sweep.attainment_target:g}): capacities answer different questions")
    if sweep.slo and plan.slo and sweep.slo != plan.slo:
        notes.append(f"SLOs differ: plan {plan.slo}, sweep {sweep.slo}")
    if sweep.mode == "concurrency":
        notes.append("a concurrency sweep has no offered rate to compare with")
    if row.capacity_capped:
        notes.append("the plan's capacity is a lower bound (its search hit the highest speed)")
    return PlanVsSweep(candidate=row.candidate, predicted_capacity_rps=row.capacity_rps,
                       measured_capacity_rps=measured_cap, capacity_error=_rel(row.capacity_rps, measured_cap),
                       predicted_knee_rps=row.knee_rps, measured_knee_rps=measured_knee,
                       knee_error=_rel(row.knee_rps, measured_knee), plan_attainment=plan.attainment_target,
                       sweep_attainment=sweep.attainment_target, notes=notes)


def lines(v: PlanVsSweep) -> list[str]:
    """The comparison as text lines (compare's table and the report share them)."""
    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:.3g}"

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:+.1%}"

    rows = [("", "predicted (plan)", "measured (sweep)", "error"),
            ("capacity req/s", num(v.predicted_capacity_rps), num(v.measured_capacity_rps), pct(v.capacity_error)),
            ("knee req/s", num(v.predicted_knee_rps), num(v.measured_knee_rps), pct(v.knee_error))]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = [f"plan vs sweep: {v.candidate}"]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out + [f"note: {n}" for n in v.notes]
