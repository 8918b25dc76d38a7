"""Capacity of one candidate in virtual time: the largest trace speed-up whose SLO attainment stays
≥ the target (bracket by doubling/halving, then geometric bisection), the knee, and what binds.

Each point is one virtual replay (replay.run.replay_virtual) summarized by the one summary
(traces.summary via replay.finish); the knee is replay.sweep's rule. A point stops early (the sim's
`stop_when` hook) once so many requests missed the SLO that the attainment target is lost. Points are
shared (`Reuse`) between candidates that differ only in a max_num_seqs the run never reached, and a
neighbour's capacity can seed the bracket (`search(hint=…)`). Never computes a metric itself beyond
the per-point diagnosis of which SLO bound failed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from slogate.replay import workload as wl
from slogate.replay.run import ReplayOptions, replay_virtual
from slogate.replay.sim.gcpace import paused
from slogate.replay.sim.records import SimResult
from slogate.replay.sweep import SweepPoint, find_knee, point_from_results
from slogate.traces.record import RequestRecord
from slogate.traces.slo import Slo
from slogate.traces.summary import RunSummary

MIN_SPEED = 1 / 256  # below this the candidate cannot meet the SLO at any load the trace offers
MAX_SPEED = 256.0  # above this the search stops (capacity reported as "at least")


class Point(msgspec.Struct, kw_only=True):
    """One simulated speed-up: the summary's curve numbers plus what the sim and the records say binds."""

    speed: float
    curve: SweepPoint
    summary: RunSummary
    preemptions: int = 0
    kv_blocks: int = 0
    ttft_violations: int = 0  # successful requests over the SLO's TTFT bound
    tpot_violations: int = 0  # … over its TPOT bound
    e2e_violations: int = 0  # … over its E2E bound alone (TTFT and TPOT within theirs, or unbounded)
    e2e_waiting: int = 0  # of those, the ones whose TTFT was the larger part of their E2E
    peak_in_flight: int = 0  # most requests between arrival and last token at once (queued or running)
    stopped_at: float | None = None  # virtual s into the run when the attainment target was lost (early stop)
    peak_running: int = 0  # most requests the engine ran at once (max_num_seqs bound only if it reached it)
    host_bound_share: float = 0.0  # of the engine's steps, the share whose length the host floor set

    @property
    def attainment(self) -> float:
        return self.summary.slo_attainment or 0.0


class Capacity(msgspec.Struct, kw_only=True):
    """The search's answer: capacity (a speed-up and the request rate it offers), knee and every point."""

    capacity_speed: float | None  # None: even the lowest speed misses the attainment target
    capacity_rps: float | None
    capped: bool = False  # the highest speed searched still met the target (capacity is at least this)
    knee_speed: float | None = None
    knee_rps: float | None = None
    points: list[Point] = []


Runner = Callable[[float], Point]


def runner(base: wl.Workload, target: str, slo: Slo, model: str, *, attainment: float | None = None,
           chunk_times: bool = True) -> Runner:
    """A function simulating `base` at a speed-up (one virtual replay per call). With `attainment`
    each run stops as soon as that target can no longer be met (`Point.stopped_at`). Without
    `chunk_times` only the records the throughput window cuts keep their per-token times
    (replay.virtual.window_cut): every number of the point is the same, it runs faster, and its
    summary has no ITL distribution (gaps of a few requests would be no figure)."""
    options = ReplayOptions(target=target, model=model, virtual=True, slos=[slo], endpoint="completions",
                            keep_chunk_times=chunk_times, window_chunk_times=not chunk_times)

    def run(speed: float) -> Point:
        with paused():  # the run and its diagnosis (replay.run pauses the run alone)
            return point(speed)

    def point(speed: float) -> Point:
        w = msgspec.structs.replace(base, requests=wl.speed(base.requests, speed),
                                    description=[*base.description, f"speed={speed:g}"])
        out = replay_virtual(w, options, stop_when=None if attainment is None else lost(w, slo, attainment))
        stats = out.sim_stats or {}
        point = diagnose(speed, out.results.summary, out.records, slo, point_from_results(speed, "", out.results),
                         preemptions=int(stats.get("preemptions", 0)), kv_blocks=int(stats.get("kv_blocks", 0)))
        stopped = stats.get("stopped_at", -1.0)
        point.stopped_at = None if stopped is None or stopped < 0 else stopped
        point.peak_running = int(stats.get("peak_running", 0))
        steps = stats.get("steps", 0)
        point.host_bound_share = stats.get("host_bound_steps", 0) / steps if steps else 0.0
        return point

    return run


class Reuse:
    """Points simulated for one engine family (candidates equal but for max_num_seqs), by speed.

    The scheduler reads max_num_seqs in one place: a waiting request is not admitted while that
    many run. A run whose running count never reached its own limit (peak < max_num_seqs) therefore
    is the unlimited run, and any limit ≥ its peak gives the very same run (same step, same
    jitter draw, same token times): the point is reused as is, not approximated."""

    def __init__(self) -> None:
        self._points: dict[tuple[float, bool], list[tuple[int, Point]]] = {}
        self.hits = 0
        self.runs = 0

    def wrap(self, run: Runner, max_num_seqs: int, *, stops: bool) -> Runner:
        """`run` for a candidate with this max_num_seqs, answering from the points already simulated."""

        def cached(speed: float) -> Point:
            for limit, point in self._points.get((speed, stops), ()):
                if point.peak_running < limit and point.peak_running <= max_num_seqs:
                    self.hits += 1
                    return point
            point = run(speed)
            self.runs += 1
            self._points.setdefault((speed, stops), []).append((max_num_seqs, point))
            return point

        return cached

    def known(self, speed: float, max_num_seqs: int, *, stops: bool) -> bool:
        return any(p.peak_running < limit and p.peak_running <= max_num_seqs
                   for limit, p in self._points.get((speed, stops), ()))


def lost(w: wl.Workload, slo: Slo, attainment: float) -> Callable[[SimResult, float], bool]:
    """The early-stop condition: True once the measured requests that already missed the SLO (an
    error, or a bound exceeded: traces.slo.is_good's rule) leave fewer good ones possible than
    `attainment` × measured. Only finished requests count, so it never stops a run that would pass."""
    warmup = {p.index for p in w.requests if p.warmup}
    n = len(w.requests) - len(warmup)
    allowed = n - attainment * n  # more bad requests than this: the target is lost
    bounds = [(k, b) for k in ("ttft", "tpot", "e2e") if (b := getattr(slo, k)) is not None]
    bad = 0

    def check(res: SimResult, _t: float) -> bool:
        nonlocal bad
        if res.id in warmup:
            return False
        if res.error is not None or len(res.token_times) < res.output_tokens or any(
                (v := getattr(res, k)) is not None and v > b for k, b in bounds):
            bad += 1
        return bad > allowed + 1e-9

    return check


def diagnose(speed: float, summary: RunSummary, records: list[RequestRecord], slo: Slo, curve: SweepPoint, *,
             preemptions: int, kv_blocks: int) -> Point:
    ttft_bad = sum(1 for r in records if _over(r.ttft, slo.ttft))
    tpot_bad = sum(1 for r in records if _over(r.tpot, slo.tpot))
    e2e_only = [r for r in records if _over(r.e2e, slo.e2e) and not _over(r.ttft, slo.ttft) and not _over(r.tpot, slo.tpot)]
    waiting = sum(1 for r in e2e_only if r.ttft is not None and r.e2e is not None and r.ttft > r.e2e - r.ttft)
    events: list[tuple[float, int]] = []
    for r in records:
        if r.e2e is not None:
            events += [(r.t, 1), (r.t + r.e2e, -1)]
    events.sort(key=lambda e: (e[0], e[1]))
    peak = level = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return Point(speed=speed, curve=curve, summary=summary, preemptions=preemptions, kv_blocks=kv_blocks,
                 ttft_violations=ttft_bad, tpot_violations=tpot_bad, e2e_violations=len(e2e_only), e2e_waiting=waiting,
                 peak_in_flight=peak)


def _over(value: float | None, bound: float | None) -> bool:
    return bound is not None and value is not None and value > bound


def search(run: Runner, *, attainment: float, precision: float = 0.02, base_rps: float,
           hint: float | None = None) -> Capacity:
    """Bracket the attainment boundary from speed 1 by doubling, or (overloaded at 1) from just under the
    throughput speed 1 reached by halving, then bisect it geometrically
    until hi/lo ≤ 1 + precision. `base_rps` is the trace's mean request rate at speed 1.

    With `hint` (a neighbouring candidate's capacity speed) the bracket starts there instead and
    widens by 1 + precision, squared at each miss: two runs when the capacity is the same."""
    points: dict[float, Point] = {}

    def ok(speed: float) -> bool:
        if speed not in points:
            points[speed] = run(speed)
        return points[speed].attainment >= attainment

    lo: float | None
    hi: float | None
    if hint is not None:
        lo, hi = _bracket(ok, min(MAX_SPEED, max(MIN_SPEED, hint)), 1 + precision)
    elif ok(1.0):
        lo, hi = 1.0, 2.0
        while ok(hi):
            lo, hi = hi, hi * 2
            if lo >= MAX_SPEED:
                hi = None
                break
    else:
        # overloaded at speed 1: the throughput it reached bounds the capacity from above, so the
        # bracket starts just under it instead of halving from 1
        first = points[1.0].summary
        rate = first.request_rate_rps
        stopped = points[1.0].stopped_at
        if stopped is not None and stopped > first.window_start_s:  # stopped early: completions per s until then
            rate = (first.requests - first.failed) / (stopped - first.window_start_s)
        guess = (rate / first.offered_rate_rps) if first.offered_rate_rps else 0.5
        hi = 1.0
        lo = min(0.9, max(MIN_SPEED, guess * 0.8))
        top = min(0.95, guess * 1.05)
        if top > lo and not ok(top):
            hi = top
        while not ok(lo):
            lo, hi = lo / 2, lo
            if hi <= MIN_SPEED:
                lo = None
                break
    if lo is not None and hi is not None:
        while hi / lo > 1 + precision:
            mid = math.sqrt(lo * hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
    pts = sorted(points.values(), key=lambda p: p.speed)
    knee = find_knee([p.curve for p in pts if p.stopped_at is None])  # a stopped run's curve is partial
    cap_rps = None
    if lo is not None:
        cap_rps = points[lo].summary.offered_rate_rps or base_rps * lo
    knee_rps = None
    if knee is not None:
        knee_rps = points[knee].summary.offered_rate_rps or base_rps * knee
    return Capacity(capacity_speed=lo, capacity_rps=cap_rps, capped=hi is None, knee_speed=knee, knee_rps=knee_rps,
                    points=pts)


def _bracket(ok: Callable[[float], bool], start: float, step: float) -> tuple[float | None, float | None]:
    """(lo, hi) around the boundary from `start`: lo passes, hi fails (None past MIN/MAX_SPEED)."""
    if ok(start):
        lo = start
        while lo < MAX_SPEED:
            hi = min(MAX_SPEED, lo * step)
            if not ok(hi):
                return lo, hi
            lo, step = hi, step * step
        return lo, None
    hi = start
    while hi > MIN_SPEED:
        lo = max(MIN_SPEED, hi / step)
        if ok(lo):
            return lo, hi
        hi, step = lo, step * step
    return None, hi


def binding_limit(point: Point | None, *, max_num_seqs: int, max_num_batched_tokens: int, prompt_p90: int) -> str | None:
    """Which limit binds at this point (the first load over the boundary), from the sim's
    preemption counter and which SLO bound the requests missed:

    - `kv_capacity`: the KV cache ran out (the engine preempted sequences);
    - `scheduler:max_num_seqs`: as many requests were in flight as the engine may run, and TTFT missed;
    - `scheduler:token_budget`: TTFT missed with a token budget below the trace's prompt p90;
    - `prefill_compute`: TTFT missed (prompts queue behind the compute);
    - `host_overhead`: TPOT missed and most engine steps lasted as long as their host work (the
      candidate's host floor, `?host_step_ms=…`), not their GPU work;
    - `decode_bandwidth`: TPOT missed (each decode step reads weights and KV from HBM);
    - None: nothing missed at this point.

    A request that missed only the E2E bound counts with the TTFT misses when its TTFT was the larger
    part of its E2E (it waited), else with the TPOT misses (its answer streamed too slowly)."""
    if point is None:
        return None
    if point.preemptions > 0:
        return "kv_capacity"
    prefill_side = point.ttft_violations + point.e2e_waiting
    decode_side = point.tpot_violations + point.e2e_violations - point.e2e_waiting
    if prefill_side == 0 and decode_side == 0:
        return None
    if prefill_side >= decode_side:
        if point.peak_in_flight >= max_num_seqs:
            return "scheduler:max_num_seqs"
        if max_num_batched_tokens < prompt_p90:
            return "scheduler:token_budget"
        return "prefill_compute"
    if point.host_bound_share > 0.5:
        return "host_overhead"
    return "decode_bandwidth"
