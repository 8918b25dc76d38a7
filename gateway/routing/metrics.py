"""Routing counters (plain dict increments on the event loop) and their Prometheus rendering.

`RoutingMetrics` is bumped by the router once per decision/retry/ejection/rejection; the collector
turns it into families only when `/metrics` is scraped. Labels: upstream, pool, policy, reason —
never request ids, models outside the configured sets, or text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class RoutingMetrics:
    __slots__ = ("decisions", "ejections", "rejections", "retries")

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str, str], int] = {}  # (upstream, pool, policy)
        self.retries: dict[tuple[str, str], int] = {}  # (pool, reason)
        self.ejections: dict[tuple[str, str], int] = {}  # (upstream, reason)
        self.rejections: dict[tuple[str, str], int] = {}  # (pool, reason)


def bump(counter: dict, key: tuple) -> None:
    counter[key] = counter.get(key, 0) + 1


class RoutingCollector(Collector):
    """Renders routing counters plus live gauges (queue depth per pool, health per upstream)."""

    def __init__(self, metrics: RoutingMetrics, queue_depths: Callable[[], Iterable[tuple[str, int]]],
                 health: Callable[[], Iterable[tuple[str, str, bool]]]) -> None:
        self.m = metrics
        self.queue_depths = queue_depths
        self.health = health

    def collect(self) -> Iterable:
        m = self.m
        for name, doc, labels, values in (
            ("slogate_routing_decisions", "Routing decisions by chosen upstream, pool and policy.",
             ["upstream", "pool", "policy"], m.decisions),
            ("slogate_retries", "Requests retried on another upstream before any byte reached the client.",
             ["pool", "reason"], m.retries),
            ("slogate_ejections", "Passive ejections of an upstream (connect errors, 5xx, timeouts).",
             ["upstream", "reason"], m.ejections),
            ("slogate_rejections", "Requests answered 429 by admission control.", ["pool", "reason"], m.rejections),
        ):
            fam = CounterMetricFamily(name, doc, labels=labels)
            for key, n in values.items():
                fam.add_metric(list(key), n)
            yield fam
        depth = GaugeMetricFamily("slogate_queue_depth", "Requests waiting in the admission queue.", labels=["pool"])
        for pool, n in self.queue_depths():
            depth.add_metric([pool], n)
        yield depth
        healthy = GaugeMetricFamily("slogate_upstream_healthy",
                                    "1 when the upstream takes traffic (active check passing, not ejected).",
                                    labels=["upstream", "pool"])
        for name, pool, ok in self.health():
            healthy.add_metric([name, pool], 1.0 if ok else 0.0)
        yield healthy
