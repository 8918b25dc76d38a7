"""`slogate compare A B [C …]`: side-by-side summary metrics with deltas vs the first side (latency
deltas with a seeded bootstrap CI; `*` marks a change beyond it), and `--fail-if` bounds for CI
(exit 1 when one is broken); `--repeat N` reads N repeated runs per side and counts their run-to-run
noise in every CI (replay.repeats). Rich table on a TTY, plain text otherwise.

Only parses arguments and prints; the comparison itself lives in replay.compare. Never writes files.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.replay.compare import (
    FAIL_IF_GRAMMAR,
    CompareError,
    Side,
    Violation,
    better_direction,
    check,
    comparison,
    deltas,
    flatten,
    intervals,
    load_side,
    mismatches,
    parse_bound,
    slos_of,
    table_metrics,
)
from slogate.replay.names import number_repeated_names
from slogate.replay.repeats import HEADLINE, Repeated, combine, group, noise, widen
from slogate.traces.slo import SloError, parse_slo
from slogate.traces.usage import UsageError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slogate compare",
        description="Compare replay runs (run directories or results.json) and captured traces side by side; "
        "deltas are against the first (the baseline).",
        epilog="examples:\n"
        "  slogate compare runs/a100 runs/h100\n"
        "  slogate compare prod-trace/ runs/candidate --fail-if 'goodput_rps<-5%' --fail-if 'ttft_s.p99>+10%'\n"
        f"--fail-if grammar: {FAIL_IF_GRAMMAR}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sides", nargs="+", metavar="RUN",
                   help="run directory, results.json, slogate trace file/dir, or an AIPerf export "
                        "(artifact dir, profile_export_aiperf.json or profile_export.jsonl), a guidellm "
                        "benchmarks.json (FILE@K: its K-th benchmark) or a vllm bench serve --save-result "
                        "JSON (--save-detailed adds its per-request lists)")
    p.add_argument("--fail-if", action="append", default=[], metavar="EXPR",
                   help="exit 1 when EXPR holds for any non-baseline side, e.g. 'goodput_rps<-5%%'")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--slo", action="append", default=[], metavar="SPEC",
                   help="SLO for trace sides, e.g. 'ttft=0.5,tpot=50ms' (default: the first run's SLO, else the trace header's)")
    p.add_argument("--all", action="store_true", help="show every percentile (p95, p99.9, count) in the table")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0: the same inputs give the same CIs)")
    p.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per side (default 400)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="each side is N repeated runs, given consecutively (RUN a1 a2 a3 b1 b2 b3 with --repeat 3): "
                   "values are the repeats' means, every metric's run-to-run spread is shown and every change's CI "
                   "covers it too")
    p.add_argument("--plan", metavar="PLAN", help="compare a `slogate plan` prediction (plan.json or its directory) "
                   "with each RUN given as a `slogate sweep` directory: predicted vs measured capacity and knee")
    p.add_argument("--candidate", metavar="SPEC", help="with --plan: the plan's candidate the sweep measured "
                   "(default: the one in the sweep's command, or the plan's only fitting one)")
    return p


def plan_vs_sweeps(plan_path: str, sweep_paths: Sequence[str], candidate: str | None, as_json: bool) -> int:
    """`compare --plan PLAN SWEEP [SWEEP …]` (replay.plan.vs_sweep does the matching and the arithmetic)."""
    from slogate.replay.plan import vs_sweep
    from slogate.replay.plan.output import load as load_plan
    from slogate.replay.sweep import load as load_sweep

    try:
        plan = load_plan(plan_path)
        sweeps = [load_sweep(p) for p in sweep_paths]
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"--plan: cannot read the plan or a sweep ({exc}); give a plan.json and sweep directories") from None
    out = []
    for path, sweep in zip(sweep_paths, sweeps, strict=True):
        row = vs_sweep.find_candidate(plan, sweep, candidate)
        if row is None:
            raise UsageError(f"{path}: which plan candidate did this sweep measure? name it with --candidate SPEC")
        out.append(vs_sweep.compare(plan, sweep, row))
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
    else:
        print("\n\n".join("\n".join(vs_sweep.lines(v)) for v in out))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.plan:
        return plan_vs_sweeps(args.plan, args.sides, args.candidate, args.json)
    if args.repeat < 1 or len(args.sides) % args.repeat:
        raise UsageError(f"bad --repeat {args.repeat}: give N ≥ 1 that divides the {len(args.sides)} runs "
                         "(each side is N consecutive runs, e.g. --repeat 2 a1 a2 b1 b2)")
    if len(args.sides) < 2 * args.repeat:
        raise UsageError("compare needs at least two sides: slogate compare BASELINE CANDIDATE [MORE …]"
                         + (f" (with --repeat {args.repeat}: {2 * args.repeat} runs)" if args.repeat > 1 else ""))
    try:
        sides = load_sides(args.sides, args.slo)
        known = list(dict.fromkeys(k for s in sides for k in flatten(s.results.summary)))
        bounds = [parse_bound(text, known, repeats=args.repeat > 1) for text in args.fail_if]
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    if args.resamples < 10:
        raise UsageError(f"bad --resamples {args.resamples}: use at least 10 (default 400)")
    reps = None
    if args.repeat > 1:
        reps = [combine(g) for g in group(sides, args.repeat)]
        name_by_parent(reps)
        sides = [r.side for r in reps]
        number_repeated_names(sides)
    cis = intervals(sides, seed=args.seed, resamples=args.resamples)
    if reps is not None:
        cis = widen(reps, cis)
    violations = check(bounds, sides, cis)
    flats = [flatten(s.results.summary) for s in sides]
    rows = known if args.all else table_metrics(flats)
    if args.json:
        data = comparison(sides, rows, cis)
        data["checks"] = {"bounds": [b.text for b in bounds], "violations": [msgspec.to_builtins(v) for v in violations],
                          "passed": not violations}
        if reps is not None:
            data["repeats"] = repeats_json(reps, rows)
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n")
    else:
        render(sides, rows, cis=cis)
        if reps is not None:
            print_noise(reps)
        print_checks(bounds, violations)
    return 1 if violations else 0


def _run_dir(source: str) -> Path:
    p = Path(source)
    return p.parent if p.name == "results.json" else p


def name_by_parent(reps: Sequence[Repeated]) -> None:
    """Sides made of `replay --repeat N` directories (`runs/a/run-1 … runs/a/run-N`) are named after the
    directory holding the repeats (`a`), as `slogate report runs/a runs/b` names them, instead of after
    their first repeat (`run-1`, `run-1#2`): when each side's repeats share one parent and the parents differ."""
    parents = []
    for rep in reps:
        dirs = {_run_dir(r.source).resolve().parent for r in rep.repeats}
        if len(dirs) != 1:
            return
        parents.append(dirs.pop())
    if len(set(parents)) != len(parents) or any(not parent.name for parent in parents):
        return
    for rep, parent in zip(reps, parents, strict=True):
        rep.side.name = parent.name


def load_sides(paths: Sequence[str], slo_specs: Sequence[str]) -> list[Side]:
    try:
        slos = [parse_slo(s, default_name="default" if i == 0 else f"slo{i}") for i, s in enumerate(slo_specs)]
    except SloError as exc:
        raise CompareError(str(exc)) from None
    sides: list[Side | None] = [None] * len(paths)
    # Runs first, so a trace side can be summarized with the runs' SLO ("production vs candidate").
    for i, path in enumerate(paths):
        side = _try_run(path)
        if side is not None:
            sides[i] = side
    if not slos:
        slos = next((slos_of(s.results) for s in sides if s is not None and slos_of(s.results)), [])
    for i, path in enumerate(paths):
        if sides[i] is None:
            sides[i] = load_side(path, slos=slos)
    out = [s for s in sides if s is not None]
    number_repeated_names(out)
    return out


def _try_run(path: str) -> Side | None:
    p = Path(path)
    if p.suffix == ".jsonl" or p.name.startswith("profile_export"):
        return None  # an AIPerf export: loaded with the runs' SLO, like a trace
    if (p.is_dir() and (p / "results.json").is_file()) or (p.is_file() and p.name.endswith(".json")):
        return load_side(p)
    return None


# -- output ------------------------------------------------------------------------------------------


def fmt_value(x: float | None) -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e12:
        return str(int(x))
    return f"{x:.4g}"


def fmt_delta(x: float | None) -> str:
    if x is None:
        return "–"
    return "+0" if x == 0 else ("+" if x > 0 else "") + fmt_value(x)


def fmt_rel(x: float | None) -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "+inf%" if x > 0 else "-inf%"
    return f"{x * 100:+.1f}%"


CIs = Sequence[dict[str, tuple[float, float]] | None]


def _cells(sides: Sequence[Side], metric: str, cis: CIs | None = None) -> list[tuple[str, str, str, float | None]]:
    """Per side: (value, Δ, Δ%, relative) strings; the baseline has no deltas. A Δ% with a bootstrap CI
    ends in `*` when the change is significant, `~` when it is within the noise."""
    values = [flatten(s.results.summary).get(metric) for s in sides]
    out = [(fmt_value(values[0]), "", "", None)]
    for i, v in enumerate(values[1:]):
        absolute, relative = deltas(values[0], v)
        rel = fmt_rel(relative)
        ci = (cis[i] or {}).get(metric) if cis else None
        if ci is not None and relative is not None:
            rel += "*" if ci[0] > 0 or ci[1] < 0 else "~"
        out.append((fmt_value(v), fmt_delta(absolute), rel, relative))
    return out


def render(sides: Sequence[Side], rows: Sequence[str], *, force_plain: bool = False, cis: CIs | None = None) -> None:
    """The side-by-side table: rich on a terminal wide enough for it (and rich installed), else plain."""
    lines = _plain_lines(sides, rows, cis)
    if not force_plain and sys.stdout.isatty():
        try:
            from rich.console import Console

            console = Console()
            if max(len(line) for line in lines) + 3 * len(lines[0].split("  ")) <= console.width:
                _render_rich(console, sides, rows, cis)
                return
        except ImportError:
            pass
    print("\n".join(lines))
    _print_sources(sides, cis)


def _plain_lines(sides: Sequence[Side], rows: Sequence[str], cis: CIs | None = None) -> list[str]:
    header = ["metric", f"{sides[0].name} (baseline)"]
    for s in sides[1:]:
        header += [s.name, "Δ", "Δ%"]
    table = [header]
    for metric in rows:
        cells = _cells(sides, metric, cis)
        line = [metric, cells[0][0]]
        for value, d, r, _ in cells[1:]:
            line += [value, d, r]
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    out = []
    for n, row in enumerate(table):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _render_rich(console, sides: Sequence[Side], rows: Sequence[str], cis: CIs | None = None) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title="slogate compare (deltas vs the first column)", header_style="bold")
    table.add_column("metric", style="cyan", no_wrap=True)
    table.add_column(f"{sides[0].name}\n(baseline)", justify="right")
    for s in sides[1:]:
        table.add_column(s.name, justify="right")
        table.add_column("Δ", justify="right")
        table.add_column("Δ%", justify="right")
    for metric in rows:
        cells = _cells(sides, metric, cis)
        row = [metric, cells[0][0]]
        for value, d, r, rel in cells[1:]:
            style = ""
            direction = better_direction(metric)
            if rel is not None and rel != 0 and direction:
                style = "green" if (rel > 0) == (direction > 0) else "red"
            row += [value, f"[{style}]{d}[/]" if style else d, f"[{style}]{r}[/]" if style else r]
        table.add_row(*row)
    console.print(table)
    _print_sources(sides, cis)


def _print_sources(sides: Sequence[Side], cis: CIs | None = None) -> None:
    if cis and any(c for c in cis):
        print("  Δ% * = beyond the 95% bootstrap CI of the change (significant), ~ = within it (noise)")
    for s in sides:
        extra = {"trace": " (captured trace, summarized like a run over its offered window)", "aiperf": " (AIPerf export)",
                 "guidellm": " (guidellm report)", "vllm-bench": " (vllm bench serve result)"}.get(s.kind, "")
        degraded = f"  DEGRADED: {'; '.join(s.results.summary.degraded_reasons)}" if s.results.summary.degraded else ""
        print(f"  {s.name}: {s.source}{extra}{degraded}")
        for note in s.notes:
            print(f"    {note}")
    for warning in mismatches(sides):
        print(f"  WARNING: {warning}")


def print_checks(bounds: Sequence[object], violations: Sequence[Violation]) -> None:
    if not bounds:
        return
    if violations:
        print(f"FAIL: {len(violations)} bound(s) broken:")
        for v in violations:
            print(f"  {v.message}")
    else:
        print(f"OK: all {len(bounds)} bound(s) hold")


def repeats_json(reps: Sequence[Repeated], rows: Sequence[str]) -> dict[str, object]:
    """`compare --json --repeat N`: the runs of each side and, per metric, each side's spread."""
    spreads = [noise(r) for r in reps]
    return {"n": len(reps[0].repeats), "sources": [[s.source for s in r.repeats] for r in reps],
            "noise": {key: [msgspec.to_builtins(sp[key]) if key in sp else None for sp in spreads] for key in rows}}


def print_noise(reps: Sequence[Repeated]) -> None:
    """One line per side: the run-to-run spread (CV over the repeats) of the headline metrics."""
    print(f"  run-to-run noise over {len(reps[0].repeats)} repeats per side (CV; the Δ% CIs cover it):")
    for rep in reps:
        sp = noise(rep)
        cells = [f"{k} {sp[k].cv * 100:.1f}%" for k in HEADLINE if k in sp and sp[k].cv is not None]
        print(f"    {rep.side.name}: " + ("  ".join(cells) or "–"))
