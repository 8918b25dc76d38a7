"""One simulated replica's engine loop, and the virtual-time Python API that replay calls.

The same loop (scheduler + step model) runs on a RealClock behind the HTTP server and on a
VirtualClock for what-if runs, where it never sleeps and jumps over idle time. It never does I/O.

Virtual-time API (no HTTP, no sleeping; same seed → same results)::

    from slogate.replay.sim.engine import SimConfig, SimRequest, simulate, run_virtual, closed_loop

    reqs = [SimRequest(arrival=0.0, prompt_tokens=32, output_tokens=128) for _ in range(8)]
    results = simulate(reqs, SimConfig(gpu="h100-sxm", model="llama-3-8b"))  # -> list[SimResult]
    results[0].ttft, results[0].e2e, results[0].tpot, results[0].itl()  # seconds, traces.metrics
    results[0].token_times  # absolute emission time of every output token (virtual seconds)
    results[0].to_record()  # traces.record.RequestRecord (t = arrival)

    run = run_virtual(reqs, config)  # SimRun: .results (input order) + .stats (preemptions, prefix hits…)
    run = run_virtual(reqs, config, stop_when=lambda res, t: …)  # early stop: True ends the run at t
    run = closed_loop(reqs, concurrency=32, config=config)  # each finish releases the next request
    run = closed_loop(reqs, 32, config, duration=600.0)  # …repeating the requests for 600 virtual s

`SimRequest(arrival, prompt_tokens, output_tokens=None, max_tokens=None, hash_ids=None,
hash_block_tokens=None, id=None)`: `output_tokens` forces the length (ignore_eos); otherwise a seeded
distribution capped by `max_tokens`. `hash_ids` are a trace's chained prefix-block ids, each covering
`hash_block_tokens` tokens (default `SimConfig.hash_block_tokens`); they map onto 16-token KV blocks
(prefix.hash_ids_to_blocks). With `config.replicas > 1` requests go round-robin in arrival order.
A request longer than the context gets `error="context_length"` and no tokens.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence

import msgspec

from slogate.replay.sim.clock import EARLY_S, RealClock, VirtualClock, drive
from slogate.replay.sim.config import EngineSpec, SimConfig, build, output_length, step_model
from slogate.replay.sim.kvcache import KVCache
from slogate.replay.sim.prefix import hash_ids_to_blocks
from slogate.replay.sim.records import SimRequest, SimResult, SimRun, SimStats
from slogate.replay.sim.scheduler import Scheduler, SimReq
from slogate.replay.sim.steptime import Roofline

__all__ = ["Engine", "SimConfig", "SimRequest", "SimResult", "SimRun", "SimStats", "closed_loop",
           "run_virtual", "simulate"]

RESYNC_S = 0.05  # real clock: a loop later than this re-anchors the schedule at now
MAX_LEAD_S = 0.004  # real clock: cap on starting a step's emission pass early


class Engine:
    """One replica: a scheduler over a KV cache, stepped on a clock."""

    def __init__(self, spec: EngineSpec, clock: RealClock | VirtualClock, *, replica: int = 0,
                 scale: Callable[[float], float] | None = None) -> None:
        c = spec.config
        self.spec = spec
        self.clock = clock
        self.replica = replica
        self.kv = KVCache(spec.kv_blocks, prefix_caching=c.prefix_caching)
        self.sched = Scheduler(self.kv, max_num_seqs=spec.max_num_seqs,
                               max_num_batched_tokens=spec.max_num_batched_tokens, policy=c.scheduler)
        self.fixed = c.timing == "constant"
        self.ttft = c.ttft_ms / 1e3
        self.itl = c.itl_ms / 1e3
        self.step_fn = None if self.fixed else step_model(spec, seed=c.seed * 1000 + replica)
        self.scale = scale  # slowdown factor at time t (fault injection)
        self.pending: list[tuple[float, int, SimReq]] = []  # future arrivals (virtual clock)
        self._timers: list[tuple[float, int, SimReq]] = []  # constant timing: next token per request
        self._active = 0  # constant timing: requests generating (at most max_num_seqs)
        self._kick: asyncio.Future[None] | None = None  # constant timing: wakes the sleeping loop
        self.wake = asyncio.Event() if clock.real else None
        self.busy_time = 0.0
        self.stopped = False
        self.coalesce = True  # virtual clock: run plain decode steps in one go (Scheduler.run_decodes)
        self.probe: Callable[[Engine, float], None] | None = None  # virtual clock: called after each step at t
        # real clock: writing a big batch's tokens takes a few ms; start the pass half of that
        # early so emission errors centre on zero instead of all being late
        self.lead = 0.0

    # -- requests in -------------------------------------------------------------------------

    def capacity_ok(self, prompt_tokens: int, output_tokens: int) -> bool:
        total = prompt_tokens + output_tokens
        return -(-total // self.kv.block_size) <= self.kv.num_blocks or self.fixed

    def submit(self, req: SimReq) -> None:
        """Hand a request to the engine now (real clock) or at req.arrival (virtual clock)."""
        if not self.clock.real and req.arrival > self.clock.now():
            heapq.heappush(self.pending, (req.arrival, req.uid, req))
            return
        self._start(req)
        if self.wake is not None:
            self.clock.wake()  # type: ignore[union-attr]
            self.wake.set()
            if self._kick is not None:
                _resolve(self._kick)

    def _start(self, req: SimReq) -> None:
        if not self.fixed:
            self.sched.add(req)
        elif self._active < self.spec.max_num_seqs:
            self._activate(req, req.arrival)
        else:
            self.sched.waiting.append(req)

    def _activate(self, req: SimReq, t: float) -> None:
        """Constant timing: req starts now; first token after TTFT, then one per ITL."""
        self._active += 1
        self.sched.peak_running = max(self.sched.peak_running, self._active)
        req.first_sched = t
        ttft = self.ttft if self.scale is None else self.ttft * self.scale(t)
        heapq.heappush(self._timers, (t + ttft, req.uid, req))

    def _release(self, t: float) -> None:
        """Constant timing: a request ended; the oldest waiting one takes its place."""
        self._active -= 1
        if self.sched.waiting:
            self._activate(self.sched.waiting.popleft(), t)

    def abort(self, req: SimReq) -> None:
        if not self.fixed:
            self.sched.abort(req)
            return
        if req.done:
            return
        req.done = req.aborted = True
        if req in self.sched.waiting:
            self.sched.waiting.remove(req)
        elif req.first_sched is not None:
            self._release(self.clock.now())
            if self._kick is not None:
                _resolve(self._kick)

    @property
    def num_running(self) -> int:
        return self._active if self.fixed else len(self.sched.running)

    @property
    def num_waiting(self) -> int:
        return len(self.sched.waiting)

    # -- the loop ----------------------------------------------------------------------------

    async def _idle(self) -> float | None:
        """Wait for work: the next virtual arrival, or a submit() on the real clock."""
        if self.wake is None:
            return self.pending[0][0] if self.pending else None
        self.clock.rest(math.inf)  # type: ignore[union-attr]
        await self.wake.wait()
        self.wake.clear()
        return self.clock.now()

    def _admit_due(self, t: float) -> None:
        pending = self.pending
        while pending and pending[0][0] <= t:
            self._start(heapq.heappop(pending)[2])

    async def run(self) -> None:
        if self.fixed:
            await self._run_fixed()
            return
        clock, sched, step = self.clock, self.sched, self.step_fn
        assert step is not None
        of_batch = getattr(step, "of_batch", None)  # a model that prices each sequence (replay.sim.vidur)
        coalesce = self.coalesce and not clock.real and self.scale is None
        t = clock.now()
        while not self.stopped:
            if self.pending:
                self._admit_due(t)
            if not sched.has_work():
                nxt = await self._idle()
                if nxt is None:
                    return
                t = max(t, nxt)
                continue
            if coalesce:  # virtual clock: a run of plain decode steps at once (same token times)
                t_end, k = sched.run_decodes(t, self.pending[0][0] if self.pending else math.inf, step)
                if k:
                    for busy in sched.run_busy:
                        self.busy_time += busy
                    t = t_end
                    await clock.sleep_until(t)
                    if self.probe is not None:
                        self.probe(self, t)
                    continue
            if not sched.schedule(t):
                head = sched.waiting[0]
                if head.arrival > t:  # real clock behind: the next step starts when it arrived
                    t = head.arrival
                    continue
                sched.abort(head)  # nothing fits even with an empty batch: fail the head request
                if head.on_finish is not None:
                    head.on_finish(head, t)
                continue
            if of_batch is None:
                dt = step(sched.new_tokens, len(sched.batch), sched.kv_tokens, sched.attn_work)
            else:
                dt = of_batch(sched.new_tokens, sched.batch, sched.batch_tokens)
            if self.scale is not None:
                dt *= self.scale(t)
            t_end = t + dt
            self.busy_time += dt
            if clock.real:
                await clock.sleep_until(t_end - self.lead)
                before = clock.now()
                sched.complete(t_end)
                now = clock.now()
                self.lead += 0.2 * (min(MAX_LEAD_S, 0.5 * (now - before)) - self.lead)
                t = t_end if now - t_end < RESYNC_S else now
            else:
                await clock.sleep_until(t_end)
                sched.complete(t_end)
                t = t_end
                if self.probe is not None:
                    self.probe(self, t)

    async def _run_fixed(self) -> None:
        """Constant timing: each request gets TTFT then ITL on its own, whatever the load; beyond
        max_num_seqs requests wait in FIFO order for a free slot."""
        clock, timers, itl = self.clock, self._timers, self.itl
        while not self.stopped:
            if not timers:
                if self.pending:
                    self._admit_due(self.pending[0][0])
                    continue
                if await self._idle() is None:
                    return
                continue
            t = timers[0][0]
            if self.pending and self.pending[0][0] < t:
                self._admit_due(self.pending[0][0])
                continue
            if clock.real:
                delay = t - clock.now()
                if delay > EARLY_S:  # sleep until the next token, or until a submit() brings an earlier one
                    clock.rest(t)  # type: ignore[union-attr]
                    delay = t - clock.now()
                    loop = asyncio.get_running_loop()
                    self._kick = loop.create_future()
                    timer = loop.call_later(delay, _resolve, self._kick)
                    await self._kick
                    timer.cancel()
                    self._kick = None
                    if clock.now() < t - EARLY_S:
                        continue
            else:
                await clock.sleep_until(t)
            while timers and timers[0][0] <= t:
                t_tok, uid, req = heapq.heappop(timers)
                if req.done:
                    continue
                req.num_generated += 1
                req.emit(t_tok)
                if req.done:
                    continue
                if req.num_generated >= req.output_tokens:
                    req.done = True
                    self._release(t_tok)
                    if req.on_finish is not None:
                        req.on_finish(req, t_tok)
                else:
                    gap = itl if self.scale is None else itl * self.scale(t_tok)
                    heapq.heappush(timers, (t_tok + gap, uid, req))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# -- virtual-time API --------------------------------------------------------------------------

def _plan(requests: Sequence[SimRequest], config: SimConfig, spec: EngineSpec
          ) -> tuple[list[SimReq], list[SimResult]]:
    rng = random.Random(config.seed)
    reqs: list[SimReq] = []
    results: list[SimResult] = []
    for i, r in enumerate(requests):
        req, res = _plan_one(i, r, rng, config, spec)
        reqs.append(req)
        results.append(res)
    return reqs, results


def _plan_one(i: int, r: SimRequest, rng: random.Random, config: SimConfig, spec: EngineSpec
              ) -> tuple[SimReq, SimResult]:
    """Engine request and its (empty) result for input `i`: drawn output length, KV block hashes."""
    cap = r.max_tokens or max(1, spec.max_model_len - r.prompt_tokens)
    out = r.output_tokens if r.output_tokens is not None else output_length(rng, config.output_median_tokens, cap)
    hashes = hash_ids_to_blocks(r.hash_ids, r.hash_block_tokens or config.hash_block_tokens,
                                r.prompt_tokens) if r.hash_ids else []
    res = SimResult(index=i, id=r.id, arrival=r.arrival, prompt_tokens=r.prompt_tokens, output_tokens=out,
                    token_times=[])
    req = SimReq(i, r.arrival, r.prompt_tokens, out, hashes, res.token_times.append)
    req.emit_all = res.token_times.extend
    return req, res


def _finish(results: list[SimResult], reqs: list[SimReq], engines: list[Engine], wall: float) -> SimRun:
    stats = SimStats(requests=len(results), wall_s=wall, kv_blocks=engines[0].kv.num_blocks,
                     max_num_seqs=engines[0].spec.max_num_seqs,
                     max_num_batched_tokens=engines[0].spec.max_num_batched_tokens)
    for e in engines:
        stats.steps += e.sched.steps
        stats.preemptions += e.sched.num_preemptions
        stats.prefix_queries_tokens += e.kv.queries
        stats.prefix_hits_tokens += e.kv.hits
        stats.busy_s += e.busy_time
        if isinstance(e.step_fn, Roofline):
            stats.host_bound_steps += e.step_fn.host_bound
        stats.peak_running = max(stats.peak_running, e.sched.peak_running)
        stats.end_time = max(stats.end_time, e.clock.now())
    for res, req in zip(results, reqs, strict=True):
        res.first_scheduled = req.first_sched
        res.cached_tokens = req.cached_tokens or 0
        res.preemptions = req.preemptions
        if res.error is None and len(res.token_times) < res.output_tokens:
            res.error = "aborted"
        stats.errors += res.error is not None
    return SimRun(results, stats)


Probe = Callable[[Engine, float], None]  # sees each engine after each virtual step (replay.virtual_samples)


def _engines(config: SimConfig, probe: Probe | None = None) -> tuple[EngineSpec, list[Engine]]:
    spec = build(config)
    engines = [Engine(spec, VirtualClock(), replica=i) for i in range(config.replicas)]
    for e in engines:
        e.probe = probe
    return spec, engines


def _too_long(res: SimResult, spec: EngineSpec, engine: Engine) -> bool:
    if res.prompt_tokens + res.output_tokens > spec.max_model_len or not engine.capacity_ok(
            res.prompt_tokens, res.output_tokens):
        res.error = "context_length"
        return True
    return False


def run_virtual(requests: Sequence[SimRequest], config: SimConfig | None = None, *,
                stop_when: Callable[[SimResult, float], bool] | None = None, probe: Probe | None = None) -> SimRun:
    """Simulate an open-loop workload in virtual time; results in input order plus engine stats.

    Early stop: `stop_when(result, t_end)` is called as each request finishes; when it returns True
    every engine's loop ends there (`stats.stopped_at` = that virtual time; unfinished requests
    get `error="aborted"`). With several replicas the engines run one after another."""
    config = config or SimConfig()
    wall = time.perf_counter()
    spec, engines = _engines(config, probe)
    reqs, results = _plan(requests, config, spec)
    stopped: list[float] = []

    def check(req: SimReq, t_end: float) -> None:
        if not stopped and stop_when is not None and stop_when(results[req.uid], t_end):
            stopped.append(t_end)
            for e in engines:
                e.stopped = True

    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    for k, i in enumerate(order):
        engine = engines[k % len(engines)]
        results[i].replica = engine.replica
        if not _too_long(results[i], spec, engine):
            if stop_when is not None:
                reqs[i].on_finish = check
            engine.submit(reqs[i])
    for engine in engines:
        drive(engine.run())
    run = _finish(results, reqs, engines, time.perf_counter() - wall)
    run.stats.stopped_at = stopped[0] if stopped else None
    return run


def simulate(requests: Sequence[SimRequest], config: SimConfig | None = None) -> list[SimResult]:
    """Per-request results of `run_virtual` (input order)."""
    return run_virtual(requests, config).results


def closed_loop(requests: Sequence[SimRequest], concurrency: int, config: SimConfig | None = None, *,
                duration: float | None = None, probe: Probe | None = None) -> SimRun:
    """Closed loop: `concurrency` requests in flight; each finish sends the next one at once.

    Arrival times in `requests` are ignored (they become the release times). One replica. With
    `duration` (virtual seconds) the requests repeat until then and nothing is sent at or after it;
    results are in send order (`SimResult.index` = position in `requests`, repeated per cycle).
    """
    config = config or SimConfig()
    wall = time.perf_counter()
    spec, engines = _engines(msgspec.structs.replace(config, replicas=1), probe)
    engine = engines[0]
    rng = random.Random(config.seed)
    reqs: list[SimReq] = []
    results: list[SimResult] = []
    source = itertools.cycle(enumerate(requests)) if duration is not None else iter(enumerate(requests))

    def release(t: float) -> None:
        if duration is not None and t >= duration:
            return
        for skipped, (i, r) in enumerate(source):
            if duration is not None and skipped >= len(requests):
                return  # a whole cycle too long for the engine: nothing left that can run
            req, res = _plan_one(i, r, rng, config, spec)
            req.uid = len(reqs)
            req.arrival = res.arrival = t
            reqs.append(req)
            results.append(res)
            if not _too_long(res, spec, engine):
                req.on_finish = lambda _r, t_end: release(t_end)
                engine.submit(req)
                return

    for _ in range(max(1, concurrency)):
        release(0.0)
    drive(engine.run())
    return _finish(results, reqs, engines, time.perf_counter() - wall)


def dependent(requests: Sequence[SimRequest], after: Sequence[int | None], delay: Sequence[float],
              config: SimConfig | None = None, *, group: Sequence[int] | None = None,
              join: Sequence[Sequence[int] | None] | None = None, stop_on_error: bool = False,
              probe: Probe | None = None) -> SimRun:
    """Sessions: request i with `after[i] = j` arrives `delay[i]` virtual seconds after request j
    finished (its last token, or its failure); with `after[i] = None` at its own arrival. `join[i]`
    lists more requests it waits for (delay counted from the last of them to finish). Arrival
    times of dependent requests are ignored (they become the release times). `group[i]` picks the
    replica (group mod replicas: a session and its subagents stay on one). With `stop_on_error` a
    failed request releases nothing, and requests never released are left out of the results
    (`SimResult.index` = position in `requests`; results in release order)."""
    config = config or SimConfig()
    wall = time.perf_counter()
    spec, engines = _engines(config, probe)
    rng = random.Random(config.seed)
    followers: dict[int, list[int]] = {}
    waiting: dict[int, int] = {}  # request → predecessors not finished yet
    latest: dict[int, float] = {}  # request → latest end among its finished predecessors
    for i, a in enumerate(after):
        preds = ([] if a is None else [a]) + list((join[i] or ()) if join is not None else ())
        for j in preds:
            followers.setdefault(j, []).append(i)
        if preds:
            waiting[i] = len(preds)
    reqs: list[SimReq] = []
    results: list[SimResult] = []

    def release(i: int, t: float) -> None:
        req, res = _plan_one(i, requests[i], rng, config, spec)
        req.uid = len(reqs)
        req.arrival = res.arrival = t
        reqs.append(req)
        results.append(res)
        engine = engines[(group[i] if group is not None else i) % len(engines)]
        res.replica = engine.replica
        if _too_long(res, spec, engine):
            finished(i, res, t)
            return
        req.on_finish = lambda _r, t_end: finished(i, res, t_end)
        engine.submit(req)

    def finished(i: int, res: SimResult, t_end: float) -> None:
        if stop_on_error and (res.error is not None or len(res.token_times) < res.output_tokens):
            return
        for j in followers.get(i, ()):
            waiting[j] -= 1
            latest[j] = max(latest.get(j, t_end), t_end)
            if waiting[j] == 0:
                release(j, latest[j] + max(0.0, delay[j]))

    roots = sorted((i for i in range(len(requests)) if i not in waiting), key=lambda i: requests[i].arrival)
    for i in roots:
        release(i, requests[i].arrival)
    for engine in engines:
        drive(engine.run())
    return _finish(results, reqs, engines, time.perf_counter() - wall)
