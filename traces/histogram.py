"""The one Prometheus histogram of slogate: plain counters updated on the hot path, families built on scrape.

Used by the gateway's live metrics and the simulator's /metrics alike. `observe` is one bisect and
three additions; never touches prometheus_client until `family()` is called at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily


class Histogram:
    """A cumulative-on-render histogram: one bisect and three increments per observation."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def buckets(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((_le(bound), acc))
        out.append(("+Inf", self.count))
        return out

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the q-quantile (coarse: for logs and benchmarks)."""
        acc = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            if self.count and acc >= q * self.count:
                return bound
        return 0.0


def _le(bound: float) -> str:
    return str(int(bound)) + ".0" if bound == int(bound) else repr(bound)


class HistogramFamily:
    __slots__ = ("bounds", "doc", "label_names", "name", "series")

    def __init__(self, name: str, doc: str, label_names: tuple[str, ...], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.label_names, self.bounds = name, doc, label_names, bounds
        self.series: dict[tuple[str, ...], Histogram] = {}

    def get(self, labels: tuple[str, ...]) -> Histogram:
        h = self.series.get(labels)
        if h is None:
            h = self.series[labels] = Histogram(self.bounds)
        return h

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=list(self.label_names))
        for labels, h in self.series.items():
            fam.add_metric(list(labels), h.buckets(), h.sum)
        return fam
