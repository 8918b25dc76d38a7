"""`--virtual` runs' server telemetry: the sim engine's running batch, queue, KV usage and counters every
interval of virtual time, as the lines `--scrape-metrics` writes (replay.scrape) plus `"source": "sim-virtual"`.
A probe the engine calls after each step (replay.sim.engine.Probe); never changes the simulation or sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from slogate.traces.engine_metrics import combine_usage

if TYPE_CHECKING:
    from slogate.replay.sim.engine import Engine

SOURCE = "sim-virtual"  # metrics.jsonl `source` of these samples (HTTP scrapes carry none)
DEFAULT_INTERVAL_S = 1.0
Snapshot = tuple[int, int, float, int, int, int]  # running, waiting, KV usage, preemptions, prefix queries, hits
_IDLE: Snapshot = (0, 0, 0.0, 0, 0, 0)


def snapshot(engine: Engine) -> Snapshot:
    """What the sim's /metrics would show for this engine now (the gauges replay.sim.server exports)."""
    kv = engine.kv
    return engine.num_running, engine.num_waiting, kv.usage(), engine.sched.num_preemptions, kv.queries, kv.hits


class VirtualSamples:
    """Per engine, its state at every multiple of `interval_s` of virtual time: the state after the last step
    that ended before that instant (an idle gap keeps the state the last step left)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"bad sampling interval {interval_s!r}: expected seconds > 0")
        self.interval_s = interval_s
        self.bins: dict[int, dict[int, Snapshot]] = {}  # bin k (t = k × interval) -> replica -> state
        self._next: dict[int, int] = {}  # replica -> next bin to fill
        self._last: dict[int, Snapshot] = {}  # replica -> state after its previous step

    def __call__(self, engine: Engine, t: float) -> None:
        r = engine.replica
        k = self._next.get(r, 0)
        now = snapshot(engine)
        if k * self.interval_s <= t:
            before = self._last.get(r, _IDLE)
            while k * self.interval_s <= t:
                self.bins.setdefault(k, {})[r] = now if k * self.interval_s == t else before
                k += 1
            self._next[r] = k
        self._last[r] = now

    def lines(self) -> list[dict[str, object]]:
        """One sample per bin: counts summed over the engines, KV usage combined as the scraper combines
        several engines' (traces.engine_metrics.combine_usage). An engine whose loop already ended shows
        nothing running or waiting and keeps its counters."""
        out: list[dict[str, object]] = []
        replicas = sorted(self._last)
        for k in sorted(self.bins):
            row = self.bins[k]
            states = []
            for r in replicas:
                s = row.get(r)
                if s is None:  # bins below _next[r] are all filled: this engine's loop had ended
                    last = self._last[r]
                    s = (0, 0, last[2], last[3], last[4], last[5])
                states.append(s)
            metrics = {"running": float(sum(s[0] for s in states)), "waiting": float(sum(s[1] for s in states)),
                       "kv_cache_usage": combine_usage(s[2] for s in states),
                       "preemptions_total": float(sum(s[3] for s in states)),
                       "prefix_cache_queries_total": float(sum(s[4] for s in states)),
                       "prefix_cache_hits_total": float(sum(s[5] for s in states))}
            out.append({"t": round(k * self.interval_s, 6), "source": SOURCE, "metrics": metrics})
        return out

    def write(self, path: Path) -> int:
        """metrics.jsonl (replaced); returns the samples written."""
        lines = self.lines()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
        return len(lines)
