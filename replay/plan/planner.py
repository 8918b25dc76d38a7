"""Plan every candidate against one workload: feasibility, capacity search, operating point, cost.

The orchestration only: each step is its own module (candidates, feasibility, capacity, cost);
the `Plan` struct is what plan.json holds. Never prints and never writes files (output does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import msgspec

from slogate.replay import sim
from slogate.replay import workload as wl
from slogate.replay.plan import capacity as cap
from slogate.replay.plan import cost as costs
from slogate.replay.plan import feasibility, scaling
from slogate.replay.plan.candidates import Candidate
from slogate.replay.redact import redact
from slogate.replay.sim import catalog
from slogate.replay.sim.config import vllm_defaults
from slogate.traces.metrics import summarize as distribution
from slogate.traces.slo import Slo
from slogate.traces.summary import RunSummary

PLAN_SCHEMA_VERSION = 1  # later fields (tp_*, interconnect, stopped_at) are optional: old files still read


class PointRow(msgspec.Struct, kw_only=True):
    """One simulated speed-up of the search (for the report and for checking the bisection)."""

    speed: float
    offered_rps: float | None
    request_rate_rps: float
    output_tokens_per_s: float
    slo_attainment: float | None
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    preemptions: int
    peak_in_flight: int
    stopped_at: float | None = None  # "stopped early: attainment lost at t=…" (virtual s)


class CandidatePlan(msgspec.Struct, kw_only=True, omit_defaults=False):
    candidate: str
    fits: bool
    reason: str | None = None
    capacity_rps: float | None = None  # largest offered rate meeting the attainment target (one replica)
    capacity_speed: float | None = None  # … as a speed-up of the trace
    capacity_capped: bool = False  # the search's highest speed still met the target
    knee_rps: float | None = None
    knee_speed: float | None = None
    operating_rps: float | None = None  # capacity × (1 − headroom)
    operating_speed: float | None = None
    replicas: int | None = None  # for the trace's busiest --peak-window at the operating point
    replicas_at_rate: int | None = None  # for --at-rate
    gpus_per_replica: int = 1
    usd_per_gpu_hour: float | None = None
    cost_per_million_good_tokens: float | None = None
    cost_per_1k_good_requests: float | None = None
    goodput_rps: float | None = None  # per replica, at the operating point
    goodput_tokens_per_s: float | None = None
    goodput_tokens_per_s_per_gpu: float | None = None
    binding_limit: str | None = None  # at the first simulated load past the capacity
    tp: int = 1
    interconnect: str | None = None  # what the TP all-reduces run over (nvlink, pcie4, pcie5)
    tp_base: int | None = None  # the smaller tp of the same candidate this row's scaling is against
    tp_speedup: float | None = None  # capacity_rps / capacity_rps at tp_base
    tp_efficiency: float | None = None  # tp_speedup / (tp / tp_base): 1.0 = as good as more replicas
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    feasibility: feasibility.Fit | None = None
    points: list[PointRow] = []
    wall_s: float = 0.0
    warnings: list[str] = []  # why a figure of this row cannot be fully trusted (operating_warnings)


class Plan(msgspec.Struct, kw_only=True, omit_defaults=False):
    """`plan.json`."""

    schema_version: int = PLAN_SCHEMA_VERSION
    trace: str | None = None
    workload: list[str] = []
    requests: int = 0
    trace_rps: float = 0.0  # mean request rate of the trace at speed 1
    context_p99_tokens: int = 0
    prompt_p90_tokens: int = 0
    slo: str = ""
    attainment_target: float = 0.99
    headroom: float = 0.10
    peak_window_s: float = 60.0
    peak_rps: float = 0.0
    at_rate_rps: float | None = None
    candidates: list[CandidatePlan] = []
    command: list[str] = []
    wall_s: float = 0.0
    sim_build: str = "python"  # "mypyc" when `make compile` built the simulator (same results, faster)


class Settings(msgspec.Struct, kw_only=True):
    slo: Slo
    attainment: float = 0.99
    headroom: float = 0.10
    peak_window_s: float = 60.0
    at_rate_rps: float | None = None
    prices: dict[str, float] = {}
    precision: float = 0.02
    early_stop: bool = True  # stop a point's simulation once its attainment target is lost
    fast: bool = True  # share points in an engine family, seed each search, search points without token times


def plan(workload: wl.Workload, candidates: Sequence[Candidate], settings: Settings, *, trace: str | None = None,
         command: Sequence[str] = (), on_candidate: Callable[[CandidatePlan], None] | None = None, jobs: int = 1) -> Plan:
    """Plan every candidate; `jobs` > 1 simulates that many points at once (same results).

    Every task (an engine family, `families`) gets its own process, up to `TASKS_PER_JOB` × jobs of
    them, and they take turns: a process simulates a point only while it holds one of `jobs` shared
    slots (`_held`). So no core idles while another family still has points to run, where a pool of
    `jobs` processes left one idle behind the family that happened to be submitted last."""
    t0 = time.perf_counter()
    reqs = workload.measured
    contexts = distribution(float(r.input_tokens + r.output_tokens) for r in reqs)
    prompts = distribution(float(r.input_tokens) for r in reqs)
    out = Plan(trace=trace, workload=[workload.source, *workload.description], requests=len(reqs),
               trace_rps=wl.mean_rate(reqs) or 0.0, context_p99_tokens=int(contexts.p99 or 0),
               prompt_p90_tokens=int(prompts.p90 or 0), slo=settings.slo.spec(),
               attainment_target=settings.attainment, headroom=settings.headroom,
               peak_window_s=settings.peak_window_s, at_rate_rps=settings.at_rate_rps,
               peak_rps=costs.peak_rate([r.t for r in reqs], settings.peak_window_s), command=redact(list(command)),
               sim_build=sim.BUILD)
    tasks = families(candidates) if settings.fast else [[i] for i in range(len(candidates))]
    rows: list[CandidatePlan | None] = [None] * len(candidates)

    def done(task: list[int], got: list[CandidatePlan]) -> None:
        for i, row in zip(task, got, strict=True):
            rows[i] = row
            if on_candidate is not None:
                on_candidate(row)

    if jobs > 1 and len(tasks) > 1:
        import concurrent.futures as cf
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold an event loop
        workers = min(len(tasks), TASKS_PER_JOB * jobs)
        slots = ctx.BoundedSemaphore(jobs) if workers > jobs else None  # inherited: passed at spawn
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_take_slots,
                                    initargs=(slots,)) as pool:
            futures = [pool.submit(plan_family, workload, [candidates[i] for i in task], settings, out)
                       for task in tasks]
            for task, fut in zip(tasks, futures, strict=True):
                done(task, fut.result())
    else:
        for task in tasks:
            done(task, plan_family(workload, [candidates[i] for i in task], settings, out))
    out.candidates = [row for row in rows if row is not None]
    fill_scaling(out.candidates, candidates)
    out.wall_s = round(time.perf_counter() - t0, 3)
    return out


TASKS_PER_JOB = 4  # processes per job: families interleave point by point (a point is seconds of CPU)
Slots = AbstractContextManager[object]  # a semaphore: `with slots:` holds one of them
_SLOTS: Slots | None = None  # in a worker process: the semaphore of the `jobs` points simulated at once


def _take_slots(slots: Slots | None) -> None:
    global _SLOTS
    _SLOTS = slots


def _held(run: cap.Runner) -> cap.Runner:
    """`run` simulating only while it holds a slot (plan's worker processes; as is elsewhere)."""
    slots = _SLOTS
    if slots is None:
        return run

    def turn(speed: float) -> cap.Point:
        with slots:
            point = run(speed)
        os.sched_yield()  # a process waiting for the slot gets it before this one asks again
        return point

    return turn


MIN_TASKS = 4  # families are split in halves until there are this many tasks (fixed: results never depend on --jobs)


def families(candidates: Sequence[Candidate]) -> list[list[int]]:
    """Candidate indices grouped by engine family (equal but for max_num_seqs), each in descending
    max_num_seqs (the order in which capacity.Reuse answers most points from the previous one)."""
    groups: dict[tuple, list[int]] = {}
    for i, cand in enumerate(candidates):
        groups.setdefault(_family(cand), []).append(i)
    tasks = [sorted(g, key=lambda i: -_seqs(candidates[i])) for g in groups.values()]
    while len(tasks) < MIN_TASKS and max(map(len, tasks), default=0) > 1:
        big = max(range(len(tasks)), key=lambda k: len(tasks[k]))
        half = (len(tasks[big]) + 1) // 2
        tasks[big:big + 1] = [tasks[big][:half], tasks[big][half:]]
    return tasks


def _family(cand: Candidate) -> tuple:
    return cand.gpu, cand.model, tuple(kv for kv in cand.opts if kv[0] != "max_num_seqs")


def _seqs(cand: Candidate) -> int:
    return cand.int_option("max_num_seqs", vllm_defaults(catalog.find_gpu(cand.gpu))[1])


def plan_family(workload: wl.Workload, cands: Sequence[Candidate], settings: Settings, ctx: Plan
                ) -> list[CandidatePlan]:
    """Plan candidates of one family in order, sharing simulated points (capacity.Reuse) and seeding
    each search with the previous capacity when its own first point is not already known."""
    reuse = cap.Reuse() if settings.fast else None
    rows: list[CandidatePlan] = []
    hint: float | None = None
    for cand in cands:
        if reuse is not None and reuse.known(1.0, _seqs(cand), stops=settings.early_stop):
            hint = None  # the plain search's points are already there: follow the same path
        row = plan_candidate(workload, cand, settings, ctx, reuse=reuse, hint=hint)
        rows.append(row)
        if reuse is not None and row.capacity_speed is not None and not row.capacity_capped:
            hint = row.capacity_speed
    return rows


def fill_scaling(rows: Sequence[CandidatePlan], candidates: Sequence[Candidate]) -> None:
    """Each row's TP step against the next smaller tp of the same candidate (scaling.steps)."""
    groups: dict[tuple, list[int]] = {}
    for i, (row, cand) in enumerate(zip(rows, candidates, strict=True)):
        row.tp = cand.int_option("tp", 1)
        row.interconnect = scaling.interconnect_of(cand.gpu, cand.options)
        groups.setdefault(scaling.group_key(cand.gpu, cand.model, cand.opts), []).append(i)
    for members in groups.values():
        for i, step in zip(members, scaling.steps([(rows[i].tp, rows[i].capacity_rps) for i in members]), strict=True):
            rows[i].tp_base, rows[i].tp_speedup, rows[i].tp_efficiency = step


def plan_candidate(workload: wl.Workload, cand: Candidate, settings: Settings, ctx: Plan, *,
                   reuse: cap.Reuse | None = None, hint: float | None = None) -> CandidatePlan:
    t0 = time.perf_counter()
    gpu = catalog.find_gpu(cand.gpu)
    d_tokens, d_seqs = vllm_defaults(gpu)
    tp = cand.int_option("tp", 1)
    gpus = tp * cand.int_option("replicas", 1)
    row = CandidatePlan(candidate=cand.spec, fits=True, gpus_per_replica=gpus,
                        usd_per_gpu_hour=settings.prices.get(gpu.name.lower()),
                        max_num_seqs=cand.int_option("max_num_seqs", d_seqs),
                        max_num_batched_tokens=cand.int_option("max_num_batched_tokens", d_tokens))
    fit = feasibility.check(cand, ctx.context_p99_tokens)
    row.feasibility = fit
    if not fit.fits:
        row.fits, row.reason = False, fit.reason
        row.wall_s = round(time.perf_counter() - t0, 3)
        return row
    # per-token times only where the throughput window cuts a request (capacity.runner): the same numbers
    run = cap.runner(workload, cand.target, settings.slo, cand.model,
                     attainment=settings.attainment if settings.early_stop else None, chunk_times=not settings.fast)
    op_run = cap.runner(workload, cand.target, settings.slo, cand.model, chunk_times=not settings.fast)  # to the end
    run, op_run = _held(run), _held(op_run)  # a shared point (reuse) needs no slot
    if reuse is not None:
        run = reuse.wrap(run, row.max_num_seqs, stops=settings.early_stop)
        op_run = reuse.wrap(op_run, row.max_num_seqs, stops=False)
    found = cap.search(run, attainment=settings.attainment, precision=settings.precision, base_rps=ctx.trace_rps,
                       hint=hint)
    row.capacity_rps, row.capacity_speed, row.capacity_capped = found.capacity_rps, found.capacity_speed, found.capped
    row.knee_rps, row.knee_speed = found.knee_rps, found.knee_speed
    # what binds: the first load past the boundary (at a knee below capacity nothing misses yet)
    limit_at = next((p for p in found.points if p.attainment < settings.attainment), None)
    row.binding_limit = cap.binding_limit(limit_at, max_num_seqs=row.max_num_seqs,
                                          max_num_batched_tokens=row.max_num_batched_tokens,
                                          prompt_p90=ctx.prompt_p90_tokens)
    summary = None
    if found.capacity_speed is None:
        lowest = min((p.speed for p in found.points), default=cap.MIN_SPEED)  # the search's halving may pass MIN_SPEED
        row.reason = f"misses {settings.attainment:.1%} SLO attainment even at {lowest:.3g}× the trace's rate"
    else:
        row.operating_speed = found.capacity_speed * (1 - settings.headroom)
        # a point the search ran to its end at this speed (--headroom 0) is the same run: not simulated twice
        op = next((p for p in found.points if p.speed == row.operating_speed and p.stopped_at is None), None)
        if op is None:
            op = op_run(row.operating_speed)
            found.points.append(op)
        summary = op.summary
        row.operating_rps = summary.offered_rate_rps or ctx.trace_rps * row.operating_speed
        row.warnings = operating_warnings(summary, settings.attainment)
    c = costs.cost(summary, gpus_per_replica=gpus, operating_rps=row.operating_rps, peak_rps=ctx.peak_rps,
                   at_rate_rps=settings.at_rate_rps, usd_per_gpu_hour=row.usd_per_gpu_hour)
    row.replicas, row.replicas_at_rate = c.replicas, c.replicas_at_rate
    row.cost_per_million_good_tokens, row.cost_per_1k_good_requests = c.cost_per_million_good_tokens, c.cost_per_1k_good_requests
    if summary is not None:
        row.goodput_rps, row.goodput_tokens_per_s = c.goodput_rps, c.goodput_tokens_per_s
        row.goodput_tokens_per_s_per_gpu = c.goodput_tokens_per_s_per_gpu
    row.points = [_row(p) for p in sorted(found.points, key=lambda p: p.speed)]
    row.wall_s = round(time.perf_counter() - t0, 3)
    return row


SERVED_SHARE_MIN = 0.9  # below this share of the offered rate served inside the trace's span, the point is a burst


def operating_warnings(summary: RunSummary, attainment: float) -> list[str]:
    """What makes the operating point's figures untrustworthy: it misses the attainment target itself
    (attainment is not monotone in load near the capacity), or too little of its load was served
    inside the sped-up trace's span (the rest drained after it: the trace is short for this load, the
    SLO held only because the burst ended, and goodput, the cost's denominator, reads low)."""
    out = []
    got = summary.slo_attainment
    if got is not None and got < attainment:
        out.append(f"the operating point misses the attainment target ({got:.1%} < {attainment:.1%}): attainment is "
                   "not monotone in load near the capacity; plan with more --headroom")
    offered = summary.offered_rate_rps
    if offered and summary.request_rate_rps < SERVED_SHARE_MIN * offered:
        out.append(f"at the operating point only {summary.request_rate_rps / offered:.0%} of the offered "
                   f"{offered:.3g} req/s was served within the sped-up trace's {summary.duration_s:.3g} s (the rest "
                   "after it): the trace is short for this load, so capacity may be a burst's and goodput reads low, "
                   "cost high; plan on a longer trace or --window")
    return out


def _row(p: cap.Point) -> PointRow:
    s = p.summary
    return PointRow(speed=p.speed, offered_rps=s.offered_rate_rps, request_rate_rps=s.request_rate_rps,
                    output_tokens_per_s=s.output_tokens_per_s, slo_attainment=s.slo_attainment,
                    ttft_p99_s=s.ttft_s.p99, tpot_p99_s=s.tpot_s.p99, preemptions=p.preemptions,
                    peak_in_flight=p.peak_in_flight, stopped_at=p.stopped_at)
