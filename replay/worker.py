"""A sending worker: paces its share of the schedule (or keeps C in flight) and collects records.

Runs in the orchestrator's process for low rates, or one per child process (own uvloop, own
aiohttp session) when the rate needs several senders. Follows a `Stop` (Ctrl-C): sends nothing more,
drains, then cancels what is in flight, each cancelled request still a record. Never summarizes,
never writes files; records go out through `emit` in batches, joined to their plan by index.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

import msgspec
import orjson

from slogate.replay import client
from slogate.replay.client import ClientConfig, InFlight, complete, new_pool
from slogate.replay.forcing import Forcing
from slogate.replay.interrupt import Stop
from slogate.replay.pacer import pace
from slogate.replay.prompts import PromptBuilder, PromptPlan
from slogate.replay.sessions import header_value
from slogate.replay.workload import PlannedRequest
from slogate.traces.record import RequestRecord, is_error

FLUSH_S = 0.2


class Item(msgspec.Struct, array_like=True):
    """One sent request as a worker hands it back (msgpack arrays across processes), joined to its
    plan by `index`."""

    index: int  # the plan's index (+ k·REPEAT_INDEX_STEP for the k-th repeat of a closed loop)
    input_tokens: int  # planned input tokens
    warmup: bool  # sent first, excluded from statistics
    record: RequestRecord


Emit = Callable[[list[Item]], None]


class WorkerSpec(msgspec.Struct):
    client: ClientConfig
    plan: PromptPlan
    forcing: Forcing
    concurrency: int | None = None  # closed loop (this worker's share of C)
    duration_s: float | None = None  # stop sending after this long (closed loop / safety)
    chat_endpoint: bool = True
    stop_on_error: bool = False  # session timing: a failed turn ends its session (--on-turn-error stop)


def request_body(builder: PromptBuilder, spec: WorkerSpec, req: PlannedRequest) -> bytes:
    """The JSON body of one planned request: synthesized prompt + output forcing + streaming usage."""
    endpoint = req.endpoint or spec.client.endpoint
    stream = spec.client.stream if req.stream is None else req.stream
    text = builder.text(req)
    body: dict = {"model": spec.client.model}
    if endpoint.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body.update(spec.forcing.fields(req.output_tokens))
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


class Collector:
    """Batches `Item`s and hands them to `emit` every FLUSH_S (and at the end)."""

    def __init__(self, emit: Emit):
        self.emit = emit
        self.batch: list[Item] = []
        self.in_flight = 0

    def add(self, req: PlannedRequest, record: RequestRecord) -> None:
        self.batch.append(Item(req.index, req.input_tokens, req.warmup, record))

    def flush(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self.emit(batch)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()


async def run_share(spec: WorkerSpec, share: list[PlannedRequest], start: float, emit: Emit,
                    stop: Stop | None = None) -> None:
    """Send this worker's share: open loop on `start + req.t`, or closed loop when `concurrency`.
    With `stop`: once `stop.sending` is set nothing more is sent; once `stop.cancel` is set the
    requests in flight are cancelled (recorded as interrupted)."""
    stop = stop or Stop()
    builder = PromptBuilder(spec.plan)
    collector = Collector(emit)
    flusher = asyncio.create_task(collector.run())
    tasks: set[asyncio.Task] = set()
    pool = new_pool(spec.client)
    try:
        bodies: dict[int, bytes] = {}
        indexes = {r.index for r in share}
        followers: dict[int, list[PlannedRequest]] = {}
        waiting: dict[int, int] = {}  # session timing: a turn's predecessors not finished yet
        latest: dict[int, float] = {}  # … and the latest completion among those that finished
        for r in share:
            preds = [j for j in ([r.after] if r.after is not None else []) + (r.join or []) if j in indexes]
            for j in preds:
                followers.setdefault(j, []).append(r)
            if preds:
                waiting[r.index] = len(preds)
        linked = bool(followers)
        roots = [r for r in share if r.index not in waiting] if linked else share

        session_header, nonce = spec.client.session_header, spec.client.session_nonce

        def begin(req: PlannedRequest, intended_ns: int) -> InFlight:
            body = bodies.pop(req.index, None) or request_body(builder, spec, req)
            extra = ((session_header, header_value(nonce, req.session)),) if session_header and req.session else ()
            return client.start(pool, spec.client, body, intended_ns=intended_ns, endpoint=req.endpoint,
                                stream=req.stream, extra=extra)

        async def one(req: PlannedRequest, intended_ns: int, sent: InFlight | None = None) -> None:
            collector.in_flight += 1
            f = sent or begin(req, intended_ns)
            try:
                record = await complete(pool, spec.client, f)
            except asyncio.CancelledError:  # only `_drain` cancels a request: record it, end normally
                record = client.interrupted(spec.client, f)
            finally:
                collector.in_flight -= 1
            if linked:  # session timing: t is the actual send offset
                record.t = intended_ns * 1e-9 - start + (record.lag or 0.0)
            else:
                record.t = req.t if spec.concurrency is None else (intended_ns * 1e-9 - start)
            record.max_tokens = req.output_tokens
            record.hash_ids = req.hash_ids
            record.session = req.session
            record.turn, record.parent_session, record.think = req.turn, req.parent_session, req.think
            collector.add(req, record)
            if followers and not (spec.stop_on_error and is_error(record)):
                done = start + record.t + record.e2e if record.e2e is not None else time.perf_counter()
                for nxt in followers.get(req.index, ()):
                    waiting[nxt.index] -= 1
                    latest[nxt.index] = max(latest.get(nxt.index, done), done)
                    if waiting[nxt.index] == 0:
                        spawn(follow(nxt, latest[nxt.index] + (nxt.think or 0.0)))

        async def follow(req: PlannedRequest, deadline: float) -> None:
            """A turn sent its think time after the previous turn completed (session timing)."""
            from slogate.replay.pacer import sleep_until

            if time.perf_counter() < deadline:
                await sleep_until(deadline)
            if not stop.sending.is_set():
                intended = round(deadline * 1e9)
                await one(req, intended, begin(req, intended))

        def spawn(coro) -> None:  # type: ignore[no-untyped-def]
            task = asyncio.create_task(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def fire(req: PlannedRequest, intended_ns: int) -> None:
            spawn(one(req, intended_ns, begin(req, intended_ns)))

        def prepare(req: PlannedRequest) -> None:
            bodies[req.index] = request_body(builder, spec, req)

        if stop.sending.is_set():
            pass  # stopped before the start: nothing is sent
        elif spec.concurrency is None:
            deadline = None if spec.duration_s is None else start + spec.duration_s
            pacer = asyncio.create_task(pace(roots, start, lambda r: r.t, fire, prepare=prepare,
                                             stopped=(lambda: time.perf_counter() >= deadline) if deadline else None))
            await _until_done_or(pacer, stop.sending)
            while tasks:  # session turns keep spawning the next one until every session ended
                await _drain(set(tasks), stop.cancel)
                if stop.cancel.is_set():
                    break
        else:
            from slogate.replay.pacer import sleep_until

            source = _cycle(share, spec.duration_s is not None)
            stop_at = None if spec.duration_s is None else start + spec.duration_s

            async def slot() -> None:
                for req in source:
                    if stop.sending.is_set() or (stop_at is not None and time.perf_counter() >= stop_at):
                        return
                    await one(req, time.perf_counter_ns())

            if await _until_done_or(asyncio.create_task(sleep_until(start)), stop.sending):
                await _drain({asyncio.create_task(slot()) for _ in range(spec.concurrency)}, stop.cancel)
    finally:
        pool.close()
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    collector.flush()


async def _done_before(fut: asyncio.Future, event: asyncio.Event) -> bool:
    """Wait until `fut` is done or `event` is set; True when `fut` finished first."""
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait((fut, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    return fut.done()


async def _until_done_or(task: asyncio.Task, event: asyncio.Event) -> bool:
    """Wait for `task`, or cancel it when `event` is set first; True when the task ran to its end."""
    if not await _done_before(task, event):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()  # a failure of the pacer is a bug: raise it
    return True


async def _drain(tasks: set[asyncio.Task], cancel: asyncio.Event) -> None:
    """Wait for the requests in flight; when `cancel` is set first, cancel the rest (each records itself)."""
    if not tasks:
        return
    everything = asyncio.gather(*tasks, return_exceptions=True)
    if not await _done_before(everything, cancel):
        for task in tasks:
            task.cancel()
    await everything


REPEAT_INDEX_STEP = 1_000_000_000  # a closed loop running for a duration: repeat k of request i is i + k·this


def _cycle(share: list[PlannedRequest], forever: bool) -> Iterator[PlannedRequest]:
    """The share once, or repeated with fresh indexes (index + k·10⁹) when running for a duration."""
    n = len(share)
    k = 0
    while True:
        for r in share:
            yield r if k == 0 else msgspec.structs.replace(r, index=r.index + k * REPEAT_INDEX_STEP,
                                                              seed_key=r.index + k * (1 << 32))
        k += 1
        if not forever or n == 0:
            return
