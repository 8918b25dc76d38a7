"""Worker processes for high rates: each runs its share of the schedule on its own uvloop.

The orchestrator starts N children (spawn), waits until each has its session ready, then gives
all of them the same monotonic start time (CLOCK_MONOTONIC is system-wide, so `perf_counter`
values agree across processes). Records come back in msgpack batches over a queue. Never
computes statistics; never leaves a child running.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue as queue_mod
import time
from collections.abc import Callable

import msgspec

from replay.worker import Item, WorkerSpec, run_share
from replay.workload import PlannedRequest


def _decoder() -> msgspec.msgpack.Decoder:
    from traces.record import RequestRecord

    return msgspec.msgpack.Decoder(list[tuple[int, int, bool, RequestRecord]])


def _child(wid: int, spec_b: bytes, share_b: bytes, start, go, out) -> None:
    """Child process entry: wait for the go signal, run the share, report records and CPU time."""
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
        asyncio.run(run_share(spec, share, start.value, lambda batch: out.put(("records", wid, enc.encode(batch)))))
        out.put(("done", wid, time.process_time() - cpu0))
    except BaseException as exc:  # report, then let the parent fail the run
        out.put(("error", wid, f"{type(exc).__name__}: {exc}"))


async def run_pool(specs: list[WorkerSpec], shares: list[list[PlannedRequest]], start_at: Callable[[], float],
                   on_items: Callable[[list[Item]], None]) -> tuple[float, float]:
    """Run shares in child processes; returns (start perf_counter value, client CPU seconds)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    start = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_child, args=(i, msgspec.msgpack.encode(spec), msgspec.msgpack.encode(s), start, go, out),
                         daemon=True) for i, (spec, s) in enumerate(zip(specs, shares, strict=True))]
    dec = _decoder()
    loop = asyncio.get_running_loop()
    cpu = 0.0

    async def get() -> tuple:
        while True:
            try:
                return await loop.run_in_executor(None, out.get, True, 0.5)
            except queue_mod.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"replay worker exited with status {dead[0].exitcode}") from None

    try:
        for p in procs:
            p.start()
        ready = 0
        while ready < len(procs):
            kind, _wid, payload = await get()
            if kind == "error":
                raise RuntimeError(f"replay worker failed: {payload}")
            ready += kind == "ready"
        start.value = start_at()
        go.set()
        done = 0
        while done < len(procs):
            kind, _wid, payload = await get()
            if kind == "records":
                on_items(dec.decode(payload))
            elif kind == "done":
                done += 1
                cpu += payload
            elif kind == "error":
                raise RuntimeError(f"replay worker failed: {payload}")
        return start.value, cpu
    finally:
        for p in procs:
            if p.pid is None:
                continue
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(5)
        with contextlib.suppress(Exception):
            out.close()
