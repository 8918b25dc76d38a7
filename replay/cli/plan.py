"""`slogate plan TRACE --slo … --candidates …`: which GPU, which flags, how many replicas and what
it costs, from one captured trace, in virtual time on the simulator.

Parses the options and hands them to replay.plan (the work) and replay.plan.output (the table and
plan.json). Never simulates or formats itself.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from slogate.replay import workload as wl
from slogate.replay.cli import replay as replay_cli
from slogate.replay.cli.args import output_dir
from slogate.replay.plan import candidates as cands
from slogate.replay.plan import output
from slogate.replay.plan.planner import Settings, plan
from slogate.traces.slo import SloError, parse_slo
from slogate.traces.usage import UsageError

EXAMPLES = """examples:
  # five deployments of one production trace, priced per GPU-hour
  slogate plan traces/samples/azure_conv_10min.csv --slo ttft=2,tpot=0.1 \\
      --candidates a100-80g/llama-3-8b,h100-sxm/llama-3-8b,l40s/llama-3-8b?dtype=fp8,l4/llama-3-8b?dtype=int4 \\
      --price a100-80g=1.8,h100-sxm=3,l40s=1.2,l4=0.8 --out plans/conv

  # the batch knobs in a small grid, and replicas for 40 req/s
  slogate plan prod.jsonl.zst --slo ttft=0.5,tpot=50ms --candidates h100-sxm/llama-3-70b?tp=4 \\
      --grid max_num_seqs=64,128,256 --grid max_num_batched_tokens=2048,8192 --at-rate 40 --json

  # the engine you calibrated (slogate sim calibrate --target URL --out gpu.toml) beside a catalog one
  slogate plan prod.jsonl.zst --slo ttft=1,tpot=0.1 --candidates 'l4/llama-3-8b?config=gpu.toml,l4/llama-3-8b'

Capacity is the largest speed-up of the trace whose SLO attainment stays ≥ --attainment (bisection in
virtual time); the operating point backs off by --headroom; cost is USD per million *good* output tokens."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slogate plan",
        usage="slogate plan TRACE --slo ttft=S,tpot=S --candidates GPU/MODEL[?opts],… [--grid KEY=V1,V2 …] "
        "[--attainment 0.99] [--headroom 0.10] [--peak-window 60s] [--at-rate R] [--price GPU=USD,…] [--json] [--out DIR]",
        description="Plan a fleet from a captured trace: feasibility, capacity, knee, replicas and cost per candidate.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
    )
    p.add_argument("trace", metavar="TRACE", help="captured trace (slogate JSONL, Mooncake, Azure CSV, BurstGPT)")
    p.add_argument("--format", dest="fmt", help="trace format when the file name does not say")
    p.add_argument("--slo", required=True, help="latency bounds a good request meets, e.g. ttft=2,tpot=0.1")
    p.add_argument("--candidates", required=True, metavar="GPU/MODEL[?opts],…",
                   help=f"deployments to plan; options: {', '.join(cands.OPTIONS)}")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="expand every candidate over these values (repeatable: the product is planned)")
    p.add_argument("--attainment", type=float, default=0.99, help="SLO attainment target (default 0.99)")
    p.add_argument("--headroom", type=float, default=0.10, help="operating point = capacity × (1 − headroom) (default 0.10)")
    p.add_argument("--peak-window", default="60s", help="replicas cover the trace's busiest window of this length (default 60s)")
    p.add_argument("--at-rate", type=float, metavar="R", help="also size the fleet for R req/s")
    p.add_argument("--price", metavar="GPU=USD,…", help="USD per GPU-hour, e.g. h100-sxm=3,l4=0.8")
    p.add_argument("--precision", type=float, default=0.02, help="bisection stops when hi/lo ≤ 1 + this (default 0.02)")
    p.add_argument("--window", help="START:END seconds of the trace to plan on (e.g. 0:600)")
    p.add_argument("--sample", type=float, help="plan on this fraction of the requests (seeded)")
    p.add_argument("--max-requests", type=int, help="plan on the first N requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", default="auto", metavar="N|auto",
                   help="simulate this many points at once (default auto: one per CPU); each engine "
                        "family runs in its own process, taking turns; never changes a result")
    p.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                   help="simulate every point to the end (default: stop once its attainment target is lost)")
    p.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    p.add_argument("--out", metavar="DIR", help="write DIR/plan.json (default: ./plan.json only with --out)")
    return p


def settings_from(ns: argparse.Namespace) -> Settings:
    try:
        slo = parse_slo(ns.slo)
        peak = wl.parse_seconds(ns.peak_window)
    except (SloError, wl.WorkloadError) as exc:
        raise UsageError(str(exc)) from None
    if slo.ttft is None and slo.tpot is None:
        raise UsageError(f"bad --slo {ns.slo!r}: give a ttft and/or tpot bound, e.g. --slo ttft=2,tpot=0.1")
    if not 0 < ns.attainment <= 1:
        raise UsageError(f"bad --attainment {ns.attainment}: a fraction in (0, 1], e.g. 0.99")
    if not 0 <= ns.headroom < 1:
        raise UsageError(f"bad --headroom {ns.headroom}: a fraction in [0, 1), e.g. 0.10")
    if not 0 < peak < math.inf:
        raise UsageError(f"bad --peak-window {ns.peak_window!r}: a positive duration, e.g. 60s")
    if ns.at_rate is not None and not 0 < ns.at_rate < math.inf:
        raise UsageError(f"bad --at-rate {ns.at_rate}: a positive request rate (req/s)")
    if not 0 < ns.precision < 1:
        raise UsageError(f"bad --precision {ns.precision}: a fraction in (0, 1), e.g. 0.02")
    return Settings(slo=slo, attainment=ns.attainment, headroom=ns.headroom, peak_window_s=peak,
                    at_rate_rps=ns.at_rate, prices=cands.parse_prices(ns.price), precision=ns.precision,
                    early_stop=ns.early_stop)


def parse_jobs(text: str) -> int:
    """`--jobs N` or `auto` (one process per CPU)."""
    if str(text).strip().lower() == "auto":
        return os.cpu_count() or 1
    if not str(text).isdigit() or int(text) < 1:
        raise UsageError(f"bad --jobs {text!r}: a number of processes ≥ 1, or auto")
    return int(text)


FEW_REQUESTS = 100  # below this, plan warns that a capacity found by speeding the trace up is not a sustained one


def workload_from(ns: argparse.Namespace) -> tuple[wl.Workload, str | None]:
    """The trace with --window/--sample/--max-requests applied (replay's own loader and transforms)."""
    from slogate.replay.sessions import has_sessions
    from slogate.replay.source import load_trace, trace_workload

    trace = load_trace(ns.trace, ns.fmt)
    w = trace_workload(trace)
    # sessions keep their recorded times (every turn is sped up with the trace: what a speed-up means)
    opts = argparse.Namespace(window=ns.window, sample=ns.sample, seed=ns.seed, speed=None, rate=None,
                              concurrency=None, loop=False, max_requests=ns.max_requests, warmup=None, shard=None,
                              session_timing="recorded", session_start="recorded")
    try:
        replay_cli.transform(w, opts, None)
    except wl.WorkloadError as exc:
        raise UsageError(str(exc)) from None
    if not w.measured:
        raise UsageError("the trace is empty after --window/--sample/--max-requests")
    if wl.mean_rate(w.measured) is None:
        raise UsageError(f"plan needs a rate to scale: at least two requests at different times (the workload has "
                         f"{len(w.measured)}); give a longer --window or more --max-requests")
    if has_sessions(w.measured):
        print("slogate plan: note: the trace has sessions; each turn is sent at its recorded time, sped up with the "
              "trace (as replay's --session-timing recorded), not think time after the previous answer",
              file=sys.stderr, flush=True)
    if len(w.measured) < FEW_REQUESTS:
        print(f"slogate plan: warning: only {len(w.measured)} requests. Sped up, a short trace is one burst rather than "
              "a sustained load, so capacities read high and costs low; use a few hundred requests or more.",
              file=sys.stderr, flush=True)
    return w, trace.path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    settings = settings_from(ns)
    jobs = parse_jobs(ns.jobs)
    candidates = cands.expand(cands.parse_candidates(ns.candidates), cands.parse_grid(ns.grid))
    for cand in candidates:
        cands.check(cand)  # every engine parses before the first point is simulated
    if ns.out:
        output_dir(Path(ns.out))  # before minutes of planning
    workload, path = workload_from(ns)
    progress = None if ns.json else (lambda c: print(output.progress_line(c), file=sys.stderr, flush=True))
    result = plan(workload, candidates, settings, trace=path, command=["slogate", "plan", *argv], on_candidate=progress,
                  jobs=jobs)
    result.candidates = output.by_cost(result)  # plan.json lists them in the table's order
    if ns.out:
        out = Path(ns.out)
        out.mkdir(parents=True, exist_ok=True)
        output.dump(result, out / "plan.json")
    if ns.json:
        print(output.to_json(result))
    else:
        output.print_table(result)
        if ns.out:
            print(f"wrote {Path(ns.out) / 'plan.json'}")
    return 0
