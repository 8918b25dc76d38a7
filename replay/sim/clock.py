"""The engine's notion of time: a real monotonic clock (HTTP server) or a virtual one (what-if runs).

Both expose `now()` and `await sleep_until(t)`; the virtual clock jumps instead of sleeping, so an
engine loop driven by it never suspends. Neither clock knows about requests. The real clock also
says when its engine rests and until when (`rest`, `wake`), so that a `GcPacer` can collect garbage
in time no engine needs.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slogate.replay.sim.gcpace import GcPacer

EARLY_S = 0.0005  # event-loop timers have millisecond granularity: due within this is due now


class VirtualClock:
    """Simulated seconds; sleeping moves time forward instantly."""

    real = False

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float) -> None:
        if t > self.t:
            self.t = t


class RealClock:
    """time.perf_counter() seconds; sleeping yields to the event loop (never spins).

    uvloop rounds timers to whole milliseconds, so a wake-up lands within ±0.5 ms of `t`.
    """

    real = True
    now = staticmethod(time.perf_counter)

    def __init__(self, pacer: GcPacer | None = None) -> None:
        self.pacer = pacer
        self.next_due = math.inf  # when the engine needs the CPU next; inf while it waits for work
        if pacer is not None:
            pacer.clocks.append(self)

    def rest(self, until: float) -> None:
        """The engine is about to wait until `until` (math.inf: until a request arrives)."""
        self.next_due = until
        if self.pacer is not None:
            self.pacer.use_slack()

    def wake(self) -> None:
        """Work arrived for an idle engine: it needs the CPU now."""
        if self.next_due == math.inf:
            self.next_due = time.perf_counter()

    async def sleep_until(self, t: float) -> None:
        self.rest(t)
        delay = t - time.perf_counter()
        if delay > EARLY_S:
            await asyncio.sleep(delay)


def drive(coro) -> None:  # type: ignore[no-untyped-def]
    """Run a coroutine that never suspends (an engine on a VirtualClock) without an event loop."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a virtual-clock engine loop suspended; it must never wait on real I/O")
