"""Per-request deadlines (first byte, idle gap, total) checked by one periodic sweep for all requests.

A request registers a `Watchdog` in a coarse timer wheel (`Deadlines`, 50 ms slots): a few set
operations per request, no timer handle per request or per chunk; one timer armed for the earliest
filed slot (the defaults put it a minute or more ahead, so a busy gateway does not wake every tick, and
an idle one, or one without timeouts, never wakes for it). The relay only stores the time
of the last chunk (`last_ns`); the sweep re-files a watchdog whose deadline moved and cancels the
relay task of one that expired, recording which deadline fired. Never reads or writes the stream.
"""

from __future__ import annotations

import asyncio
import math
from time import perf_counter_ns

from slogate.gateway.config import Timeouts

TICK_S = 0.05


def _ns(seconds: float) -> int | None:
    return None if math.isinf(seconds) else int(seconds * 1e9)


def limits_ns(timeouts: Timeouts) -> tuple[int | None, int | None, int | None]:
    """(ttfb, idle, total) in ns, None for unlimited: computed once, shared by every Watchdog."""
    return _ns(timeouts.ttfb), _ns(timeouts.idle), _ns(timeouts.total)


class Deadlines:
    """Timer wheel: slot number (deadline // tick) → watchdogs due in that slot."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_ns = int(tick_s * 1e9)
        self.slots: dict[int, set[Watchdog]] = {}
        self._done_slot = perf_counter_ns() // self.tick_ns  # every slot up to this one was swept
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._tick_slot = 0  # the slot the armed timer is for

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.slots:
            self._arm(min(self.slots))

    async def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self._loop = None

    def _arm(self, slot: int) -> None:
        """The timer goes off when `slot` is due (no earlier timer is armed)."""
        if self._loop is None or (self._tick is not None and self._tick_slot <= slot):
            return
        if self._tick is not None:
            self._tick.cancel()
        self._tick_slot = slot
        self._tick = self._loop.call_later(max(0.0, (slot * self.tick_ns - perf_counter_ns()) * 1e-9), self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self.sweep(perf_counter_ns())
        if self.slots:
            self._arm(min(self.slots))

    def file(self, wd: Watchdog, deadline_ns: int) -> None:
        slot = max(deadline_ns // self.tick_ns + 1, self._done_slot + 1)
        if wd.slot == slot:
            return
        self.unfile(wd)
        wd.slot = slot
        bucket = self.slots.get(slot)
        if bucket is None:
            self.slots[slot] = {wd}
            self._arm(slot)
        else:
            bucket.add(wd)

    def unfile(self, wd: Watchdog) -> None:
        if wd.slot is not None:
            bucket = self.slots.get(wd.slot)
            if bucket is not None:
                bucket.discard(wd)
                if not bucket:
                    del self.slots[wd.slot]
            wd.slot = None

    def sweep(self, now_ns: int) -> None:
        current = now_ns // self.tick_ns
        due = sorted(slot for slot in self.slots if slot <= current)
        for slot in due:
            bucket = self.slots.pop(slot, None)
            if bucket:
                for wd in bucket:
                    wd.slot = None
                    wd.check(now_ns)
        self._done_slot = max(self._done_slot, current)


class Watchdog:
    __slots__ = ("_idle_ns", "_owner", "_task", "_total_at", "_ttfb_at", "_ttfb_ns", "fired", "last_ns", "slot")

    def __init__(self, owner: Deadlines, limits: tuple[int | None, int | None, int | None], t0_ns: int) -> None:
        self._owner = owner
        self._task = asyncio.current_task()
        self._ttfb_ns, self._idle_ns, total = limits
        self._total_at = None if total is None else t0_ns + total
        self._ttfb_at: int | None = None
        self.slot: int | None = None
        self.fired: str | None = None  # "timeout_ttfb" | "timeout_idle" | "timeout_total"
        self.last_ns = t0_ns

    def waiting_first_byte(self, now_ns: int) -> None:
        """The request is about to go upstream: the first-byte deadline starts now."""
        self._ttfb_at = None if self._ttfb_ns is None else now_ns + self._ttfb_ns
        self._file()

    def streaming(self, now_ns: int) -> None:
        """Response headers arrived: from now on the idle gap (and the total) count."""
        self._ttfb_at = None
        self.last_ns = now_ns
        self._file()

    def stop(self) -> None:
        self._owner.unfile(self)

    def expire(self, reason: str) -> None:
        """End the request now (e.g. "shutdown" when the grace period is over)."""
        if self.fired is None:
            self.fired = reason
            if self._task is not None:
                self._task.cancel()

    def _next(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        if self._ttfb_at is not None:
            best = (self._ttfb_at, "timeout_ttfb")
        elif self._idle_ns is not None:
            best = (self.last_ns + self._idle_ns, "timeout_idle")
        if self._total_at is not None and (best is None or self._total_at < best[0]):
            best = (self._total_at, "timeout_total")
        return best

    def _file(self) -> None:
        nxt = self._next()
        if nxt is None:
            self._owner.unfile(self)
        else:
            self._owner.file(self, nxt[0])

    def check(self, now_ns: int) -> None:
        """Called by the sweep when the filed slot is due: fire, or re-file at the moved deadline."""
        nxt = self._next()
        if nxt is None:
            return
        if nxt[0] <= now_ns:
            self.fired = nxt[1]
            if self._task is not None:
                self._task.cancel()
        else:
            self._owner.file(self, nxt[0])
