"""Absolute-schedule pacing on the monotonic clock: wake at each intended send time, then fire.

Coarse waits sleep on the event loop (its timers have 1 ms resolution); the last few ms are slept
in a helper thread with `time.sleep` (µs precision, no CPU burnt) which then wakes the loop, so
response parsing keeps running meanwhile. Dense schedules (thousands of requests/s) are walked by
one such thread end to end. Requests due at once go back to back. Never creates tasks ahead of
their time and never does I/O itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from slogate.traces.runtime import shorten_switch_interval

COARSE_MARGIN_S = 0.003  # below this the helper thread sleeps precisely instead of a loop timer
PREPARE_AHEAD_S = 0.001  # an item due later than this is prepared (its body built) on the loop beforehand
T = TypeVar("T")
_executor: ThreadPoolExecutor | None = None


def _precise() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(1, thread_name_prefix="slogate-pacer")
        shorten_switch_interval()  # the waking helper never waits 5 ms for the loop thread
    return _executor


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


async def sleep_until(deadline: float) -> None:
    """Return at (just after) `deadline`, a `time.perf_counter()` value."""
    remaining = deadline - time.perf_counter()
    if remaining > COARSE_MARGIN_S:
        await asyncio.sleep(remaining - COARSE_MARGIN_S)
    if deadline - time.perf_counter() > 0:
        await asyncio.get_running_loop().run_in_executor(_precise(), _sleep_until, deadline)


async def pace(
    items: Sequence[T],
    start: float,
    when: Callable[[T], float],
    fire: Callable[[T, int], None],
    *,
    prepare: Callable[[T], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> None:
    """For each item (in schedule order): `prepare` it, wait until `start + when(item)`, `fire` it
    with the intended time in perf_counter ns. A late pacer fires at once (the lag is recorded).

    A schedule whose mean gap is below COARSE_MARGIN_S (above ~330 req/s per sender) is walked by a
    helper thread (`_pace_dense`): a wait per request through the executor costs more CPU than the
    request itself at thousands per second (measured: 5,000 req/s on 2 senders collapsed to 4,300
    with lag p99 2.9 s, and holds 5,000 with it). Sparser schedules wait on the loop as before."""
    n = len(items)
    dense = n > 1 and (when(items[-1]) - when(items[0])) < COARSE_MARGIN_S * (n - 1)
    walk = _pace_dense if dense else _pace_sparse
    await walk(items, start, when, fire, prepare=prepare, stopped=stopped)


async def _pace_sparse(
    items: Sequence[T],
    start: float,
    when: Callable[[T], float],
    fire: Callable[[T, int], None],
    *,
    prepare: Callable[[T], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> None:
    """Sparse schedules: each wait on the loop (`sleep_until`), the item prepared before it."""
    for item in items:
        if stopped is not None and stopped():
            return
        deadline = start + when(item)
        if prepare is not None:
            prepare(item)
        if time.perf_counter() < deadline:
            await sleep_until(deadline)
        fire(item, round(deadline * 1e9))


async def _pace_dense(
    items: Sequence[T],
    start: float,
    when: Callable[[T], float],
    fire: Callable[[T, int], None],
    *,
    prepare: Callable[[T], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> None:
    """Dense schedules: one helper thread walks the schedule. It sleeps to each send time (coarse part
    on an Event, so a cancel stops it at once; the last COARSE_MARGIN_S with `time.sleep`) and hands
    the item to the loop with one `call_soon_threadsafe`, which the loop coalesces when several are
    due: no executor round trip and no coroutine resume per request. `when` and `stopped` run on the
    helper thread (pure functions of the item and the clock); `prepare` and `fire` on the loop."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    halt = threading.Event()

    def on_loop(item: T, intended_ns: int) -> None:
        if halt.is_set():
            return
        try:
            fire(item, intended_ns)
        except BaseException as exc:  # a failing `fire` is a bug: raise it from `pace`, as on the loop path
            halt.set()
            end(exc)

    def on_prepare(item: T) -> None:
        if halt.is_set() or prepare is None:
            return
        try:
            prepare(item)
        except BaseException as exc:
            halt.set()
            end(exc)

    def end(exc: BaseException | None) -> None:
        if finished.done():
            return
        if exc is None:
            finished.set_result(None)
        else:
            finished.set_exception(exc)

    def walk() -> None:
        try:
            for item in items:
                if halt.is_set() or (stopped is not None and stopped()):
                    break
                deadline = start + when(item)
                remaining = deadline - time.perf_counter()
                if prepare is not None and remaining > PREPARE_AHEAD_S:
                    loop.call_soon_threadsafe(on_prepare, item)  # built on the loop while this thread sleeps
                if remaining > COARSE_MARGIN_S and halt.wait(remaining - COARSE_MARGIN_S):
                    break
                remaining = deadline - time.perf_counter()
                if remaining > 0:
                    time.sleep(remaining)
                loop.call_soon_threadsafe(on_loop, item, round(deadline * 1e9))
            error = None
        except BaseException as exc:  # a failing `when`/`stopped` is a bug: raise it on the loop
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody waits
            loop.call_soon_threadsafe(end, error)

    shorten_switch_interval()  # the waking helper never waits 5 ms for the loop thread
    thread = threading.Thread(target=walk, name="slogate-pacer", daemon=True)
    thread.start()
    try:
        await finished
    finally:
        halt.set()


def start_from_wall_clock(start_unix: float) -> float:
    """The perf_counter value of a shared wall-clock start (`--start-at`; every shard agrees)."""
    return time.perf_counter() + (start_unix - time.time())
