"""`slogate plan` speed: wall and CPU time to plan N candidates on a trace window, in virtual time.

Run: `.venv/bin/python tests/bench/plan_speed.py [--trace F] [--window 0:3600] [--candidates 20] [--jobs 2]
[--baseline | --baseline-search]` (SLOGATE_PURE=1: the pure-Python simulator even after `make compile`); `--baseline` first plans the same candidates without the early stop,
`--baseline-search` without the search shortcuts (before/after in one run).
Default: the full-hour Azure conversation trace (../shared/traces/, else the bundled 10-minute
sample) × 20 candidates (4 GPU/dtype choices × max_num_seqs 32…512), the issue's target being
under a minute on 2 cores. Prints a table (one row per candidate) and writes
tests/bench/results/plan_speed.json. A benchmark script, never a timed test.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

import msgspec  # noqa: E402
from bench_output import aligned_rows, save_json  # noqa: E402

from slogate.replay.cli.plan import build_parser, settings_from, workload_from  # noqa: E402
from slogate.replay.plan import candidates as cands  # noqa: E402
from slogate.replay.plan.planner import plan  # noqa: E402

FULL = REPO.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SAMPLE = REPO / "traces" / "samples" / "azure_conv_10min.csv"
BASE = ("a100-80g/llama-3-8b", "h100-sxm/llama-3-8b", "l40s/llama-3-8b?dtype=fp8", "l4/llama-3-8b?dtype=int4")
SEQS = ("32", "64", "128", "256", "512")
PRICES = "a100-80g=1.8,h100-sxm=3,l40s=1.2,l4=0.8"


def box_speed() -> float:
    """CPU seconds of a fixed pure-Python loop (10 M additions): this VM's speed drifts by up to ~1.5×
    within an hour, so the runs carry it (before and after) to be compared at the same speed."""
    t, x = time.process_time(), 0
    for i in range(10_000_000):
        x += i
    return round(time.process_time() - t, 3)


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(FULL if FULL.exists() else SAMPLE))
    ap.add_argument("--window", default="0:3600")
    ap.add_argument("--candidates", type=int, default=20, help="how many of the 20 grid candidates to plan")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--precision", type=float, default=0.02)
    ap.add_argument("--baseline", action="store_true", help="also time the same plan with --no-early-stop, first")
    ap.add_argument("--baseline-search", action="store_true",
                    help="also time the same plan without the search shortcuts (Settings.fast=False: no shared "
                         "points, no seeded brackets, search points with token times), first")
    args = ap.parse_args()
    grid = cands.expand([cands.parse_candidate(c) for c in BASE], cands.parse_grid([f"max_num_seqs={','.join(SEQS)}"]))
    chosen = sorted(grid, key=lambda c: SEQS.index(c.options['max_num_seqs']))[: args.candidates]  # GPUs first
    ns = build_parser().parse_args([args.trace, "--slo", "ttft=2,tpot=0.1", "--candidates", BASE[0], "--price", PRICES,
                                    "--window", args.window, "--precision", str(args.precision)])
    settings = settings_from(ns)
    workload, _ = workload_from(ns)
    before = None
    if args.baseline or args.baseline_search:
        t0, c0 = time.perf_counter(), cpu_s()
        changed = {"fast": False} if args.baseline_search else {"early_stop": False}
        old = plan(workload, chosen, msgspec.structs.replace(settings, **changed), jobs=args.jobs)
        before = {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu_s() - c0, 2),
                  "capacity_rps": [c.capacity_rps for c in old.candidates]}
        what = "no search shortcuts" if args.baseline_search else "no early stop"
        print(f"before ({what}): {before['wall_s']:.1f} s wall, {before['cpu_s']:.1f} s CPU", flush=True)
    loop_before = box_speed()
    t0, c0 = time.perf_counter(), cpu_s()
    result = plan(workload, chosen, settings, jobs=args.jobs)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    loop_after = box_speed()
    rows = [["candidate", "capacity req/s", "points", "stopped early", "wall s"]]
    for c in result.candidates:
        rows.append([c.candidate, "–" if c.capacity_rps is None else f"{c.capacity_rps:.3g}", str(len(c.points)),
                     str(sum(p.stopped_at is not None for p in c.points)), f"{c.wall_s:.1f}"])
    print("\n".join(aligned_rows(rows)))
    print(f"{len(chosen)} candidates × {result.requests} requests ({args.window} of {Path(args.trace).name}), "
          f"--jobs {args.jobs}, {result.sim_build} simulator: {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"(target: 1 h × 20 candidates < 60 s); box speed: a fixed loop {loop_before:.2f} s before, {loop_after:.2f} s after")
    save_json(HERE / "results" / "plan_speed.json", {
        "trace": Path(args.trace).name, "window": args.window, "requests": result.requests, "jobs": args.jobs,
        "sim_build": result.sim_build,
        "box_loop_s": [loop_before, loop_after], "candidates": len(chosen), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "precision": args.precision,
        "before_no_early_stop": before, "same_capacities": None if before is None else
        before["capacity_rps"] == [c.capacity_rps for c in result.candidates],
        "per_candidate": [{"candidate": c.candidate, "capacity_rps": c.capacity_rps, "points": len(c.points),
                           "wall_s": c.wall_s} for c in result.candidates],
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
