"""Garbage collection in the engines' idle time (the real-clock server only).

CPython starts a collection when allocations pass a threshold, which in a busy server means in the
middle of a step's token pass: with 500 live streams a full collection took 12–22 ms here, and every
token written after it was that late. `GcPacer` turns automatic collection off and runs a due
generation only when every engine is asleep with time to spare before its next step (the measured
cost of that generation × MARGIN).

When engines never rest (e.g. constant timing with hundreds of streams: a token is due every few
µs), nothing would ever be collected in idle time, and one late catch-up collection of everything
piled up took ~40 ms. So a watchdog hands collection back to CPython (its small, frequent young
collections) once young objects pile up, and the pacer takes over again as soon as an engine rests
with room for a middle collection. A full collection runs at least every `full_max_age_s`, so
memory stays bounded in every case.

Clocks report when they sleep and until when (`RealClock.rest`); the pacer only reads those times.
Virtual-clock runs never use it: they hold automatic collection off for the run instead (`paused`),
because everything a run allocates stays alive until it ends, so the ~500 collections one planned hour
made (a fifth of its CPU) found nothing to free; a run's garbage goes at the next collection after it.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, Metric

MARGIN = 1.5  # collect only when the slack is this many times the generation's expected pause
YOUNG_THRESHOLD = 700  # CPython's own gen-0 threshold: allocations between young collections
MIDDLE_THRESHOLD = 10  # CPython's own gen-1 threshold: young collections between middle ones
PILE_UP = 10  # watchdog: young allocations at this many thresholds means the engines do not rest
TRIGGERS = ("idle", "forced", "automatic")


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside (a virtual run); the collector's state as it was after (nests)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Resting(Protocol):
    next_due: float  # when the clock's engine runs next; math.inf while idle


class GcPacer:
    """Runs gc.collect(generation) in idle time; one per process (the collector is process-wide)."""

    def __init__(self, *, full_every_s: float = 30.0, full_max_age_s: float = 120.0,
                 watchdog_s: float = 0.25) -> None:
        self.full_every_s = full_every_s
        self.full_max_age_s = full_max_age_s
        self.watchdog_s = watchdog_s
        self.clocks: list[Resting] = []
        self.cost = [0.5e-3, 2e-3, 20e-3]  # expected pause per generation, learnt from each collection
        self.last_full = time.perf_counter()
        self.collections = {(g, trigger): 0 for g in range(3) for trigger in TRIGGERS}
        self.pause_total = [0.0, 0.0, 0.0]
        self.handovers = 0  # times collection went back to CPython because no engine rested
        self._timer: asyncio.TimerHandle | None = None
        self._ours = False  # inside one of our own gc.collect() calls
        self._auto_start = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def install(self) -> None:
        """Freeze what startup allocated, switch automatic collection off, start the watchdog."""
        gc.collect()
        gc.freeze()
        gc.disable()
        gc.callbacks.append(self._on_gc)
        self.last_full = time.perf_counter()
        self._timer = asyncio.get_running_loop().call_later(self.watchdog_s, self._watchdog)

    def uninstall(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()
        gc.enable()

    # -- deciding ----------------------------------------------------------------------------

    def due(self, now: float) -> list[int]:
        """Generations that are due, oldest first."""
        young, middle, _ = gc.get_count()
        out = []
        if now - self.last_full >= self.full_every_s:
            out.append(2)
        if middle >= MIDDLE_THRESHOLD:
            out.append(1)
        if young >= YOUNG_THRESHOLD:
            out.append(0)
        return out

    def slack(self, now: float) -> float:
        """Seconds until the first engine needs the CPU (math.inf when all are idle)."""
        return min((c.next_due for c in self.clocks), default=math.inf) - now

    def use_slack(self) -> None:
        """A clock is about to sleep: run the oldest due generation that fits before any engine wakes."""
        now = time.perf_counter()
        slack = self.slack(now)
        if gc.isenabled():
            if slack < MARGIN * self.cost[1]:
                return  # CPython keeps collecting until engines rest long enough for a middle collection
            gc.disable()  # they do again: back to collecting in their idle time
        for g in self.due(now):
            if MARGIN * self.cost[g] <= slack:
                self._collect(g, "idle")
                return

    def _watchdog(self) -> None:
        now = time.perf_counter()
        if self.slack(now) == math.inf:  # every engine idle: anything due may run
            self.use_slack()
        elif now - self.last_full >= self.full_max_age_s:
            self._collect(2, "forced")
        elif not gc.isenabled() and gc.get_count()[0] >= PILE_UP * YOUNG_THRESHOLD:
            self.handovers += 1
            gc.enable()  # no engine rests: CPython's small, frequent collections until one does
        self._timer = asyncio.get_running_loop().call_later(self.watchdog_s, self._watchdog)

    def _collect(self, generation: int, trigger: str) -> None:
        t = time.perf_counter()
        self._ours = True
        try:
            gc.collect(generation)
        finally:
            self._ours = False
        pause = time.perf_counter() - t
        # remember the worst recent pause: a collection that overruns its slack makes tokens late
        self.cost[generation] = max(pause, 0.9 * self.cost[generation])
        self.pause_total[generation] += pause
        self.collections[generation, trigger] += 1
        if generation == 2:
            self.last_full = t + pause

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks hook: counts CPython's own collections while it has the job."""
        if self._ours:
            return
        if phase == "start":
            self._auto_start = time.perf_counter()
            return
        generation = info["generation"]
        self.collections[generation, "automatic"] += 1
        self.pause_total[generation] += time.perf_counter() - self._auto_start
        if generation == 2:
            self.last_full = time.perf_counter()

    # -- /metrics ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Prometheus collector: collections by generation and trigger, their total pause, handovers."""
        c = CounterMetricFamily("slogate_sim_gc_collections", "Garbage collections of the sim process.",
                                labels=["generation", "trigger"])
        for (g, trigger), n in self.collections.items():
            c.add_metric([str(g), trigger], n)
        yield c
        p = CounterMetricFamily("slogate_sim_gc_pause_seconds", "Time spent in those collections.",
                                labels=["generation"])
        for g, s in enumerate(self.pause_total):
            p.add_metric([str(g)], s)
        yield p
        yield CounterMetricFamily("slogate_sim_gc_handovers", "Times collection went back to CPython's "
                                  "automatic collector because no engine rested.", value=self.handovers)
