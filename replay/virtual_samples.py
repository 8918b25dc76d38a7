"""`--virtual` runs' server telemetry: the sim engine's running batch, queue, KV usage and counters every
interval of virtual time, as the lines `--scrape-metrics` writes (replay.scrape) plus `"source": "sim-virtual"`.
A probe the engine calls after each step (replay.sim.engine.Probe); never changes the simulation or sleeps.

Kept as each engine's changes of state, not a state per interval, so an idle stretch costs nothing however
long it is (a trace spanning a day or a year of virtual time): a run of more than `MAX_RUN` identical
samples (nothing changes while the engines are idle) is written as its first and last sample, the values
holding in between.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from slogate.traces.engine_metrics import combine_usage

if TYPE_CHECKING:
    from slogate.replay.sim.engine import Engine

SOURCE = "sim-virtual"  # metrics.jsonl `source` of these samples (HTTP scrapes carry none)
DEFAULT_INTERVAL_S = 1.0
MAX_RUN = 60  # a longer run of identical samples (an idle stretch) is written as its first and last sample
Snapshot = tuple[int, int, float, int, int, int]  # running, waiting, KV usage, preemptions, prefix queries, hits
_IDLE: Snapshot = (0, 0, 0.0, 0, 0, 0)


def snapshot(engine: Engine) -> Snapshot:
    """What the sim's /metrics would show for this engine now (the gauges replay.sim.server exports)."""
    kv = engine.kv
    return engine.num_running, engine.num_waiting, kv.usage(), engine.sched.num_preemptions, kv.queries, kv.hits


def _ended(last: Snapshot) -> Snapshot:
    """An engine whose loop ended: nothing running or waiting, its KV usage and counters kept."""
    return 0, 0, last[2], last[3], last[4], last[5]


class VirtualSamples:
    """Per engine, its state at every multiple of `interval_s` of virtual time: the state after the last step
    that ended before that instant (an idle gap keeps the state the last step left)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"bad sampling interval {interval_s!r}: expected seconds > 0")
        self.interval_s = interval_s
        self._steps: dict[int, list[tuple[int, Snapshot]]] = {}  # replica -> (bin k, state from bin k on)
        self._next: dict[int, int] = {}  # replica -> next bin to fill
        self._last: dict[int, Snapshot] = {}  # replica -> state after its previous step

    def __call__(self, engine: Engine, t: float) -> None:
        r = engine.replica
        k = self._next.get(r, 0)
        now = snapshot(engine)
        if k * self.interval_s <= t:
            last = max(k, self._bin_at(t))  # bins k … last are filled now
            exact = last * self.interval_s == t
            if k < last or not exact:
                self._hold(r, k, self._last.get(r, _IDLE))
            if exact:
                self._hold(r, last, now)
            self._next[r] = last + 1
        self._last[r] = now

    def _bin_at(self, t: float) -> int:
        """The last bin k with k × interval ≤ t (one correction each way: no loop, whatever t's magnitude)."""
        k = math.floor(t / self.interval_s)
        if (k + 1) * self.interval_s <= t:
            k += 1
        if k * self.interval_s > t:
            k -= 1
        return k

    def _hold(self, replica: int, k: int, state: Snapshot) -> None:
        """From bin k on, this engine shows `state` (until its next change)."""
        steps = self._steps.setdefault(replica, [])
        if steps and steps[-1][0] == k:
            steps.pop()
        if not steps or steps[-1][1] != state:
            steps.append((k, state))

    def _runs(self) -> Iterator[tuple[int, int, list[Snapshot]]]:
        """(first bin, end bin, each engine's state) of every stretch of bins in which no engine changes."""
        end = max(self._next.values(), default=0)
        steps = {r: [*self._steps.get(r, []), (self._next.get(r, 0), _ended(last))] for r, last in self._last.items()}
        bounds = sorted({k for s in steps.values() for k, _ in s if k < end} | {0})
        pos = dict.fromkeys(steps, 0)
        for a, b in zip(bounds, [*bounds[1:], end], strict=True):
            states = []
            for r in sorted(steps):
                s, i = steps[r], pos[r]
                while i + 1 < len(s) and s[i + 1][0] <= a:
                    i += 1
                pos[r] = i
                states.append(s[i][1])
            yield a, b, states

    def lines(self) -> list[dict[str, object]]:
        """One sample per bin: counts summed over the engines, KV usage combined as the scraper combines
        several engines' (traces.engine_metrics.combine_usage). An engine whose loop already ended shows
        nothing running or waiting and keeps its counters. A run of more than MAX_RUN identical samples
        is written as its first and last."""
        out: list[dict[str, object]] = []
        for a, b, states in self._runs():
            metrics = {"running": float(sum(s[0] for s in states)), "waiting": float(sum(s[1] for s in states)),
                       "kv_cache_usage": combine_usage(s[2] for s in states),
                       "preemptions_total": float(sum(s[3] for s in states)),
                       "prefix_cache_queries_total": float(sum(s[4] for s in states)),
                       "prefix_cache_hits_total": float(sum(s[5] for s in states))}
            for k in range(a, b) if b - a <= MAX_RUN else (a, b - 1):
                out.append({"t": round(k * self.interval_s, 6), "source": SOURCE, "metrics": dict(metrics)})
        return out

    def write(self, path: Path) -> int:
        """metrics.jsonl (replaced); returns the samples written."""
        lines = self.lines()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
        return len(lines)
