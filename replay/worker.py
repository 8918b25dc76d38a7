"""A sending worker: paces its share of the schedule (or keeps C in flight) and collects records.

Runs in the orchestrator's process for low rates, or one per child process (own uvloop, own
aiohttp session) when the rate needs several senders. Never summarizes, never writes files;
records go out through `emit` in batches, joined to their plan by index.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

import msgspec
import orjson

from replay import client
from replay.client import ClientConfig, InFlight, complete, new_pool
from replay.forcing import Forcing
from replay.pacer import pace
from replay.prompts import PromptBuilder, PromptPlan
from replay.workload import PlannedRequest
from traces.record import RequestRecord

Item = tuple[int, int, bool, RequestRecord]  # (plan index, planned input tokens, warmup, record)
Emit = Callable[[list[Item]], None]
FLUSH_S = 0.2


class WorkerSpec(msgspec.Struct):
    client: ClientConfig
    plan: PromptPlan
    forcing: Forcing
    concurrency: int | None = None  # closed loop (this worker's share of C)
    duration_s: float | None = None  # stop sending after this long (closed loop / safety)
    chat_endpoint: bool = True


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
    """Batches (index, record) pairs and hands them to `emit` every FLUSH_S (and at the end)."""

    def __init__(self, emit: Emit):
        self.emit = emit
        self.batch: list[Item] = []
        self.in_flight = 0

    def add(self, req: PlannedRequest, record: RequestRecord) -> None:
        self.batch.append((req.index, req.input_tokens, req.warmup, record))

    def flush(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self.emit(batch)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()


async def run_share(spec: WorkerSpec, share: list[PlannedRequest], start: float, emit: Emit) -> None:
    """Send this worker's share: open loop on `start + req.t`, or closed loop when `concurrency`."""
    builder = PromptBuilder(spec.plan)
    collector = Collector(emit)
    flusher = asyncio.create_task(collector.run())
    tasks: set[asyncio.Task] = set()
    pool = new_pool(spec.client)
    try:
        bodies: dict[int, bytes] = {}

        def begin(req: PlannedRequest, intended_ns: int) -> InFlight:
            body = bodies.pop(req.index, None) or request_body(builder, spec, req)
            return client.start(pool, spec.client, body, intended_ns=intended_ns, endpoint=req.endpoint,
                                stream=req.stream)

        async def one(req: PlannedRequest, intended_ns: int, sent: InFlight | None = None) -> None:
            collector.in_flight += 1
            try:
                record = await complete(pool, spec.client, sent or begin(req, intended_ns))
            finally:
                collector.in_flight -= 1
            record.t = req.t if spec.concurrency is None else (intended_ns * 1e-9 - start)
            record.max_tokens = req.output_tokens
            record.hash_ids = req.hash_ids
            record.session = req.session
            collector.add(req, record)

        def fire(req: PlannedRequest, intended_ns: int) -> None:
            task = asyncio.create_task(one(req, intended_ns, begin(req, intended_ns)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def prepare(req: PlannedRequest) -> None:
            bodies[req.index] = request_body(builder, spec, req)

        if spec.concurrency is None:
            deadline = None if spec.duration_s is None else start + spec.duration_s
            await pace(share, start, lambda r: r.t, fire, prepare=prepare,
                       stopped=(lambda: time.perf_counter() >= deadline) if deadline else None)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        else:
            from replay.pacer import sleep_until

            await sleep_until(start)
            source = _cycle(share, spec.duration_s is not None)
            stop_at = None if spec.duration_s is None else start + spec.duration_s

            async def slot() -> None:
                for req in source:
                    if stop_at is not None and time.perf_counter() >= stop_at:
                        return
                    await one(req, time.perf_counter_ns())

            await asyncio.gather(*(slot() for _ in range(spec.concurrency)))
    finally:
        pool.close()
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    collector.flush()


def _cycle(share: list[PlannedRequest], forever: bool) -> Iterator[PlannedRequest]:
    """The share once, or repeated with fresh indexes (index + k·10⁹) when running for a duration."""
    n = len(share)
    k = 0
    while True:
        for r in share:
            yield r if k == 0 else msgspec.structs.replace(r, index=r.index + k * 1_000_000_000,
                                                              seed_key=r.index + k * (1 << 32))
        k += 1
        if not forever or n == 0:
            return
