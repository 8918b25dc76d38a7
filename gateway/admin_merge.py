"""One gateway to the outside with `--workers N`: merge the workers' `/metrics` and status rows.

Prometheus samples are merged by name and labels: counters, histograms and per-worker gauges are
summed (prometheus_client's process memory, open fds and CPU seconds: the workers' totals); gauges
that already read the shared state (in-flight per upstream, upstream health) or describe one process
(loop lag, build info, the open-files limit) take the largest value, a process start time the
smallest (the oldest worker's). The status windows are
recomputed from all workers' rows by the one summary (traces/summary.py via gateway/status.py).
Pure functions on bytes and structs: never does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import add

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from slogate.gateway.status import StatusWindow
from slogate.gateway.worker_admin import WorkerStatus

# Gauges every worker reports for the whole gateway (or for itself alone): the largest value, not a sum.
NOT_SUMMED = frozenset({
    "slogate_inflight_requests", "slogate_inflight_tokens", "slogate_upstream_healthy",
    "slogate_event_loop_lag_seconds", "slogate_build_info",
    "process_max_fds",  # a per-process limit
})
# Gauges that are a moment: the earliest, not a sum (a sum of two start times is a date decades ahead).
SMALLEST = frozenset({"process_start_time_seconds"})


def _combine(fam: Metric) -> Callable[[float, float], float]:
    """How two workers' values of one sample of `fam` merge."""
    if fam.type == "gauge" and fam.name in SMALLEST:
        return min
    if fam.type == "gauge" and fam.name in NOT_SUMMED:
        return max
    return add


def parse(text: str) -> list[Metric]:
    return list(text_string_to_metric_families(text))


def cumulative(families: Iterable[Metric]) -> list[Metric]:
    """Only the counters and histograms: what a dead worker leaves in the totals (its gauges go)."""
    return [f for f in families if f.type in ("counter", "histogram", "summary")]


def merge_metrics(expositions: Iterable[Iterable[Metric]]) -> list[Metric]:
    """The families of several expositions, their samples combined (order: first seen)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, list]] = {}
    for exposition in expositions:
        for fam in exposition:
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                values[fam.name] = {}
            rows = values[fam.name]
            combine = _combine(fam)
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                row = rows.get(key)
                if row is None:
                    rows[key] = [s.name, dict(s.labels), s.value]
                elif s.name.endswith("_created"):
                    row[2] = min(row[2], s.value)
                else:
                    row[2] = combine(row[2], s.value)
    for name, merged in families.items():
        for sample_name, labels, value in values[name].values():
            merged.add_sample(sample_name, labels, value)
    return list(families.values())


def merge_status(window: StatusWindow, parts: Sequence[WorkerStatus], now: float,
                 retired: WorkerStatus | None = None) -> dict:
    """`/slogate/status` over all workers: one summary of every worker's rows, totals summed.

    `window` carries the SLOs and the shared clock base; its own rows are not used. `retired`:
    the rows and count of workers that died (their upstream/routing extras are not used)."""
    every = [*parts, retired] if retired is not None else list(parts)
    rows = sorted((row for p in every for row in p.rows), key=lambda r: r.finished)
    window.total_requests = sum(p.requests_total for p in every)
    doc = window.snapshot(rows, now)
    if not parts:
        return doc
    first = parts[0].extras  # upstream in-flight counts and ejection read the shared state
    doc["upstreams"] = first.get("upstreams", {})
    routing = dict(first.get("routing", {}))
    depth: dict[str, int] = {}
    for p in parts:
        for pool, n in p.extras.get("routing", {}).get("queue_depth", {}).items():
            depth[pool] = depth.get(pool, 0) + n
    routing["queue_depth"] = depth
    routing["upstreams"] = _sum_ejections(routing.get("upstreams", []), parts)
    doc["routing"] = routing
    traces = [p.extras.get("trace", {}) for p in parts]
    doc["trace"] = {"enabled": any(t.get("enabled") for t in traces),
                    "written": sum(t.get("written", 0) for t in traces),
                    "dropped": sum(t.get("dropped", 0) for t in traces)}
    doc["event_loop_lag_s"] = max(p.extras.get("event_loop_lag_s") or 0.0 for p in parts)
    return doc


def _sum_ejections(upstreams: list[dict], parts: Sequence[WorkerStatus]) -> list[dict]:
    """The first worker's per-upstream routing status with `ejections` summed over the workers: each
    worker counts the passive ejections it made (as `slogate_ejections_total`, which is summed)."""
    total: dict[str, int] = {}
    for p in parts:
        for u in p.extras.get("routing", {}).get("upstreams", []):
            total[u["name"]] = total.get(u["name"], 0) + u.get("ejections", 0)
    return [{**u, "ejections": total.get(u["name"], u.get("ejections", 0))} for u in upstreams]
