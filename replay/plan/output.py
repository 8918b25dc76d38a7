"""How a plan is shown and stored: a table sorted by cost (rich on a terminal, plain text otherwise)
and `plan.json`. Formatting and file writing only; never simulates or computes a figure.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import msgspec

from slogate.replay.plan import scaling
from slogate.replay.plan.planner import CandidatePlan, Plan
from slogate.replay.results import read_json, write_json

HEADER = ("candidate", "fits", "capacity req/s", "knee req/s", "operating req/s", "replicas", "$/M good tok",
          "$/1k good req", "good tok/s/GPU", "TP scaling", "binding limit")


def by_cost(plan: Plan) -> list[CandidatePlan]:
    """Candidates that fit first, cheapest per good token first; unpriced after priced; misfits last."""
    def key(c: CandidatePlan) -> tuple:
        cost = c.cost_per_million_good_tokens
        return (not c.fits, c.capacity_rps is None, cost is None, cost or 0.0, -(c.capacity_rps or 0.0))
    return sorted(plan.candidates, key=key)


def _num(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


def _money(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}" if v < 10 else f"{v:.2f}"


def cells(c: CandidatePlan) -> list[str]:
    cap = _num(c.capacity_rps) + ("+" if c.capacity_capped else "")
    replicas = "–" if c.replicas is None else str(c.replicas)
    if c.replicas_at_rate is not None:
        replicas += f" ({c.replicas_at_rate} at rate)"
    limit = c.binding_limit or ("–" if c.fits else (c.reason or "does not fit"))
    return [c.candidate, "yes" if c.fits else "no", cap, _num(c.knee_rps), _num(c.operating_rps), replicas,
            _money(c.cost_per_million_good_tokens), _money(c.cost_per_1k_good_requests),
            _num(c.goodput_tokens_per_s_per_gpu, 4), scaling.describe(c.tp, scaling.Step(c.tp_base, c.tp_speedup, c.tp_efficiency), c.interconnect), limit]


def progress_line(c: CandidatePlan) -> str:
    """`plan: CANDIDATE: 5.44 req/s, 9 points (5 stopped early: attainment lost at t=35–300 s) (43.2s)`."""
    head = f"{c.capacity_rps:.3g} req/s" if c.capacity_rps else (c.reason or "no capacity")
    stops = [p.stopped_at for p in c.points if p.stopped_at is not None]
    if c.points:
        head += f", {len(c.points)} points"
    if stops:
        span = f"{min(stops):.3g}" if len(stops) == 1 else f"{min(stops):.3g}–{max(stops):.3g}"
        head += f" ({len(stops)} stopped early: attainment lost at t={span} s)"
    return f"plan: {c.candidate}: {head} ({c.wall_s:.1f}s)"


def footer(plan: Plan) -> list[str]:
    at = f", --at-rate {plan.at_rate_rps:g} req/s" if plan.at_rate_rps else ""
    return [f"SLO {plan.slo} at ≥ {plan.attainment_target:.1%} attainment; operating point = capacity × "
            f"(1 − {plan.headroom:g}); replicas for the busiest {plan.peak_window_s:g}s ({plan.peak_rps:.3g} req/s){at}",
            f"trace: {plan.requests} requests at {plan.trace_rps:.3g} req/s, context p99 {plan.context_p99_tokens} "
            f"tokens; planned in {plan.wall_s:.1f}s (virtual time, {plan.sim_build} simulator)",
            *(f"warning: {c.candidate}: {w}" for c in by_cost(plan) for w in c.warnings)]


def print_table(plan: Plan, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    rows = [cells(c) for c in by_cost(plan)]
    if stream.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            pass
        else:
            table = Table(title="slogate plan", title_justify="left")
            for name in HEADER:
                table.add_column(name, overflow="fold")
            for r in rows:
                table.add_row(*r, style=None if r[1] == "yes" else "dim")
            console = Console(file=stream)
            console.print(table)
            for line in footer(plan):
                console.print(line, highlight=False)
            return
    all_rows = [list(HEADER), *rows]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(HEADER))]
    for r in all_rows:
        stream.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    for line in footer(plan):
        stream.write(line + "\n")


def dump(plan: Plan, path: str | Path) -> None:
    write_json(plan, path)


def load(path: str | Path) -> Plan:
    """Read a plan.json (a directory holding one is accepted too)."""
    return read_json(path, Plan, "plan.json")


def to_json(plan: Plan) -> str:
    return msgspec.json.format(msgspec.json.encode(plan)).decode()
