"""Worker processes for high rates: each runs its share of the schedule on its own uvloop.

The orchestrator starts N children (spawn), waits until each has its session ready, then gives
all of them the same monotonic start time (CLOCK_MONOTONIC is system-wide, so `perf_counter`
values agree across processes). Records come back in msgpack batches over a queue. Children
ignore SIGINT/SIGTERM: on Ctrl-C the orchestrator sets shared stop events and they drain, cancel and
hand back what they have. Never computes statistics; never leaves a child running.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from slogate.replay.interrupt import Stop, blocked, ignore_signals
from slogate.replay.worker import Item, WorkerSpec, run_share
from slogate.replay.workload import PlannedRequest


def _decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(list[Item])


POLL_S = 0.05  # how often a child looks at the stop events and at its parent
CHILD_EXIT_S = 10.0  # after the cancel, how long children get to hand back their records


class StopEvents(msgspec.Struct):
    """Cross-process form of `interrupt.Stop`, set by the orchestrator only (children ignore signals)."""

    sending: Any  # multiprocessing Event
    cancel: Any  # multiprocessing Event
    parent: int  # orchestrator pid: a child whose parent is gone exits at once


def _child(wid: int, spec_b: bytes, share_b: bytes, start, go, stop: StopEvents, out) -> None:
    """Child process entry: wait for the go signal, run the share, report records and CPU time."""
    ignore_signals()  # started with SIGINT/SIGTERM blocked: a Ctrl-C to the group is the parent's to handle
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    spec = msgspec.msgpack.decode(spec_b, type=WorkerSpec)
    share = msgspec.msgpack.decode(share_b, type=list[PlannedRequest])
    enc = msgspec.msgpack.Encoder()
    out.put(("ready", wid, None))
    go.wait()
    cpu0 = time.process_time()
    try:
        asyncio.run(_child_share(spec, share, start.value, stop,
                                 lambda batch: out.put(("records", wid, enc.encode(batch)))))
        out.put(("done", wid, time.process_time() - cpu0))
    except BaseException as exc:  # report, then let the parent fail the run
        out.put(("error", wid, f"{type(exc).__name__}: {exc}"))


async def _child_share(spec: WorkerSpec, share: list[PlannedRequest], start: float, events: StopEvents,
                       emit: Callable[[list[Item]], None]) -> None:
    stop = Stop()
    _follow_once(stop, events)
    follower = asyncio.create_task(_follow(stop, events))
    try:
        await run_share(spec, share, start, emit, stop)
    finally:
        follower.cancel()


def _follow_once(stop: Stop, events: StopEvents) -> None:
    if events.sending.is_set():
        stop.sending.set()
    if events.cancel.is_set():
        stop.cancel.set()
    if os.getppid() != events.parent:  # the orchestrator died (SIGKILL): nobody to hand records to
        os._exit(1)


async def _follow(stop: Stop, events: StopEvents) -> None:
    """Mirror the orchestrator's stop events into this child's loop (a cheap, non-blocking poll)."""
    while True:
        await asyncio.sleep(POLL_S)
        _follow_once(stop, events)


async def run_pool(specs: list[WorkerSpec], shares: list[list[PlannedRequest]], start_at: Callable[[], float],
                   on_items: Callable[[list[Item]], None], stop: Stop | None = None) -> tuple[float, float]:
    """Run shares in child processes; returns (start perf_counter value, client CPU seconds).
    `stop` (the orchestrator's Ctrl-C) is passed on to every child; they hand back what they have."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    start = ctx.Value("d", 0.0)
    events = StopEvents(sending=ctx.Event(), cancel=ctx.Event(), parent=os.getpid())
    procs = [ctx.Process(target=_child, args=(i, msgspec.msgpack.encode(spec), msgspec.msgpack.encode(s), start, go,
                                              events, out), daemon=True)
             for i, (spec, s) in enumerate(zip(specs, shares, strict=True))]
    dec = _decoder()
    loop = asyncio.get_running_loop()
    cpu = 0.0
    relay = asyncio.create_task(_relay(stop, events)) if stop is not None else None

    async def get() -> tuple:
        while True:
            try:
                return await loop.run_in_executor(None, out.get, True, 0.5)
            except queue_mod.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"replay worker exited with status {dead[0].exitcode}") from None

    try:
        with blocked():  # children inherit the mask, so a Ctrl-C cannot reach them before they ignore it
            for p in procs:
                p.start()
        ready = 0
        while ready < len(procs):
            kind, _wid, payload = await get()
            if kind == "error":
                raise RuntimeError(f"replay worker failed: {payload}")
            ready += kind == "ready"
        start.value = start_at()
        if stop is not None and stop.sending.is_set():
            events.sending.set()  # interrupted while the children started: they send nothing
        go.set()
        done = 0
        while done < len(procs):
            message = await _get_until(get, stop)
            if message is None:
                break  # cancelled, and a child does not answer: keep what came back (it is terminated below)
            kind, _wid, payload = message
            if kind == "records":
                on_items(dec.decode(payload))
            elif kind == "done":
                done += 1
                cpu += payload
            elif kind == "error":
                raise RuntimeError(f"replay worker failed: {payload}")
        return start.value, cpu
    finally:
        if relay is not None:
            relay.cancel()
        for p in procs:
            if p.pid is None:
                continue
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(5)
        with contextlib.suppress(Exception):
            out.close()


async def _relay(stop: Stop, events: StopEvents) -> None:
    """Orchestrator side: set the children's events when its own `stop` phases begin."""
    await stop.sending.wait()
    events.sending.set()
    await stop.cancel.wait()
    events.cancel.set()


async def _get_until(get: Callable[[], Awaitable[tuple]], stop: Stop | None) -> tuple | None:
    """The next message; None when the run was cancelled and no child answered within CHILD_EXIT_S."""
    if stop is None or not stop.cancel.is_set():
        return await get()
    try:
        return await asyncio.wait_for(get(), CHILD_EXIT_S)
    except TimeoutError:
        return None
