"""Absolute-schedule pacing on the monotonic clock: wake at each intended send time, then fire.

Coarse waits sleep on the event loop (its timers have 1 ms resolution); the last few ms are slept
in a helper thread with `time.sleep` (µs precision, no CPU burnt) which then wakes the loop, so
response parsing keeps running meanwhile. Requests due at once go back to back. Never creates
tasks ahead of their time and never does I/O itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from slogate.traces.runtime import shorten_switch_interval

COARSE_MARGIN_S = 0.003  # below this the helper thread sleeps precisely instead of a loop timer
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
    with the intended time in perf_counter ns. A late pacer fires at once (the lag is recorded)."""
    for item in items:
        if stopped is not None and stopped():
            return
        deadline = start + when(item)
        if prepare is not None:
            prepare(item)
        if time.perf_counter() < deadline:
            await sleep_until(deadline)
        fire(item, round(deadline * 1e9))


def start_from_wall_clock(start_unix: float) -> float:
    """The perf_counter value of a shared wall-clock start (`--start-at`; every shard agrees)."""
    return time.perf_counter() + (start_unix - time.time())
