"""`--virtual`: run a workload through the simulator's virtual-time API (no HTTP, no sleeping).

Planned requests become `SimRequest`s with their exact lengths and prefix ids; results become the
same `RequestRecord`s an HTTP replay produces (lag 0, chunk times from token emission times).
Never touches the network or the wall clock beyond timing itself.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING

from slogate.replay.finish import window
from slogate.replay.worker import REPEAT_INDEX_STEP, Item
from slogate.replay.workload import Workload
from slogate.traces.record import RequestRecord
from slogate.traces.summary import finished_at

if TYPE_CHECKING:
    from slogate.replay.sim.engine import Probe
    from slogate.replay.sim.records import SimResult


def run_virtual(workload: Workload, sim_opts: dict[str, str], *, endpoint: str, model: str | None,
                stop_on_error: bool = False, stop_when: Callable[[SimResult, float], bool] | None = None,
                probe: Probe | None = None, keep_chunk_times: bool = True,
                window_chunk_times: bool = False) -> tuple[list[Item], dict[str, float]]:
    """Simulate the workload; returns (items, engine stats). Linked turns (session timing) go
    through the sim's dependent-release API: each is sent its think time after its predecessor ended.
    `stop_when` (open loop only) is the sim's early stop: stats["stopped_at"] is when it fired, else -1.
    `probe` sees each engine after each step (replay.virtual_samples records the server telemetry).
    Without `keep_chunk_times` records carry no per-token times (the ITL summary stays); with
    `window_chunk_times` too, only the records the throughput window cuts keep them (window_cut)
    and no record has an ITL summary (plan's search points: no ITL figure is made of them)."""
    from slogate.replay.sim.engine import SimRequest, closed_loop, dependent, run_virtual
    from slogate.replay.target import sim_config
    from slogate.replay.workload import root_session

    config = sim_config(sim_opts, virtual=True)
    reqs = [
        SimRequest(arrival=p.t, prompt_tokens=p.input_tokens, output_tokens=p.output_tokens, hash_ids=p.hash_ids,
                   hash_block_tokens=p.block_size or workload.block_size, id=p.index)
        for p in workload.requests
    ]
    linked = any(p.after is not None for p in workload.requests)
    if linked and not workload.concurrency:
        pos = {p.index: i for i, p in enumerate(workload.requests)}
        roots = root_session(workload.requests)
        groups: dict[str, int] = {}
        run = dependent(reqs, [None if p.after is None or p.after not in pos else pos[p.after]
                               for p in workload.requests],
                        [p.think or 0.0 for p in workload.requests], config,
                        group=[groups.setdefault(roots[p.index], len(groups)) for p in workload.requests],
                        join=[[pos[j] for j in p.join if j in pos] if p.join else None for p in workload.requests],
                        stop_on_error=stop_on_error, probe=probe)
    elif workload.concurrency:  # with --duration the share repeats until then, as a live closed loop does
        run = closed_loop(reqs, workload.concurrency, config, duration=workload.duration_s, probe=probe)
    else:
        run = run_virtual(reqs, config, stop_when=stop_when, probe=probe)
    items: list[Item] = []
    repeats = [0] * len(workload.requests)
    itl = keep_chunk_times or not window_chunk_times
    for res in run.results:
        plan = workload.requests[res.index]
        index = plan.index + repeats[res.index] * REPEAT_INDEX_STEP  # fresh index per repeat (worker._cycle)
        repeats[res.index] += 1
        rec = res.to_record(endpoint=endpoint, model=model, itl=itl, lag=0.0, max_tokens=plan.output_tokens,
                            hash_ids=plan.hash_ids, session=plan.session, turn=plan.turn,
                            parent_session=plan.parent_session, think=plan.think)
        if res.token_times and keep_chunk_times:  # --no-chunk-times, as on HTTP
            rec.chunk_times = _chunk_times(res)
        items.append(Item(index, plan.input_tokens, plan.warmup, rec))
    if window_chunk_times and not keep_chunk_times:
        cut = window_cut([it.record for it in items if not it.warmup], open_loop=not workload.concurrency)
        for it, res in zip(items, run.results, strict=True):
            if res.token_times and (it.record.error is not None or finished_at(it.record) >= cut):
                it.record.chunk_times = _chunk_times(res)
    s = run.stats
    stats = {"preemptions": s.preemptions, "prefix_queries_tokens": s.prefix_queries_tokens,
             "prefix_hits_tokens": s.prefix_hits_tokens, "wall_s": s.wall_s, "kv_blocks": s.kv_blocks,
             "stopped_at": -1.0 if s.stopped_at is None else s.stopped_at, "peak_running": s.peak_running,
             "steps": s.steps, "host_bound_steps": s.host_bound_steps}
    return items, stats


def _chunk_times(res: SimResult) -> list[float]:
    # round(t - arrival, 9) per token, in C loops (this is a large part of a full virtual run)
    return list(map(round, map(operator.sub, res.token_times, repeat(res.arrival)), repeat(9)))


CUT_MARGIN_S = 1e-6  # chunk times are rounded to 1e-9 s: a request ending closer than this to the end may cross it


def window_cut(records: list[RequestRecord], *, open_loop: bool) -> float:
    """From when on a request's tokens may fall outside the summary's throughput window
    (replay.finish.window). Every token of a request
    that ended before it is inside the window (it starts at the first arrival or send), and then the
    window counts exactly its output tokens with or without chunk times (traces.summary.output_tokens_in)."""
    if not records:
        return math.inf
    return window(records, open_loop=open_loop).end - CUT_MARGIN_S
