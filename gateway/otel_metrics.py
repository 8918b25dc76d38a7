"""OTLP metrics (`--otel`, extra `slogate[otel]`): the `/metrics` families pushed over OTLP/HTTP every
OTEL_METRIC_EXPORT_INTERVAL ms (default 60000), cumulative, with the GenAI semconv names and attributes.

Reads the same registry `/metrics` renders (so the numbers and label sets are the same), on the event
loop at export time, and sends from a thread. Never instruments the data path, and never adds a
label /metrics does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry

from slogate.gateway.otel import bounded_shutdown, in_daemon_thread
from slogate.traces.usage import UsageError

log = logging.getLogger("slogate.gateway.otel")

# Prometheus family -> (OTel GenAI semconv instrument, unit); other families keep their name.
INSTRUMENTS = {
    "gen_ai_server_time_to_first_token_seconds": ("gen_ai.server.time_to_first_token", "s"),
    "gen_ai_server_time_per_output_token_seconds": ("gen_ai.server.time_per_output_token", "s"),
    "gen_ai_server_request_duration_seconds": ("gen_ai.server.request.duration", "s"),
    "gen_ai_client_token_usage": ("gen_ai.client.token.usage", "{token}"),
}
# Prometheus label -> semconv attribute (the exporters' translation run backwards); others unchanged.
ATTRIBUTES = {
    "gen_ai_operation_name": "gen_ai.operation.name",
    "gen_ai_provider_name": "gen_ai.provider.name",
    "gen_ai_request_model": "gen_ai.request.model",
    "gen_ai_response_model": "gen_ai.response.model",
    "gen_ai_token_type": "gen_ai.token.type",
    "error_type": "error.type",
}
SKIP_PREFIXES = ("process_", "python_")  # host metrics: the collector's hostmetrics receiver's job
DEFAULT_INTERVAL_MS = 60000


def _attributes(labels: dict[str, str]) -> dict[str, str]:
    """Labels as attributes. An empty label is an absent one in Prometheus; in OTLP an empty attribute is
    present, so `error.type=""` would mark every successful request as failed: empty labels are left out."""
    return {ATTRIBUTES.get(k, k): v for k, v in labels.items() if k != "le" and v != ""}


def metrics_data(families: Iterable[Any], start_unix_ns: int, now_ns: int, resource: Any) -> Any:
    """prometheus_client families (as `registry.collect()` yields them) as one SDK MetricsData."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    cumulative = AggregationTemporality.CUMULATIVE
    out = []
    for fam in families:
        if fam.name.startswith(SKIP_PREFIXES) or not fam.samples:
            continue
        name, unit = INSTRUMENTS.get(fam.name, (fam.name, fam.unit or None))
        if fam.type == "histogram":
            series: dict[tuple, dict[str, Any]] = {}
            for s in fam.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                point = series.setdefault(key, {"buckets": [], "sum": 0.0, "count": 0})
                if s.name.endswith("_bucket"):
                    point["buckets"].append((float(s.labels["le"]), int(s.value)))
                elif s.name.endswith("_sum"):
                    point["sum"] = s.value
                elif s.name.endswith("_count"):
                    point["count"] = int(s.value)
            points = []
            for key, p in series.items():
                cum = sorted(p["buckets"])
                counts = [n - (cum[i - 1][1] if i else 0) for i, (_, n) in enumerate(cum)]
                points.append(HistogramDataPoint(
                    attributes=_attributes(dict(key)), start_time_unix_nano=start_unix_ns, time_unix_nano=now_ns,
                    count=p["count"], sum=p["sum"], bucket_counts=counts,
                    explicit_bounds=[b for b, _ in cum if b != float("inf")],
                    min=None, max=None))  # type: ignore[arg-type]  # unknown: left unset in the protobuf
            data: Any = Histogram(data_points=points, aggregation_temporality=cumulative)
        elif fam.type in ("counter", "gauge", "info"):
            points = [NumberDataPoint(attributes=_attributes(s.labels), start_time_unix_nano=start_unix_ns,
                                      time_unix_nano=now_ns, value=s.value)
                      for s in fam.samples if not s.name.endswith("_created")]
            data = (Sum(data_points=points, aggregation_temporality=cumulative, is_monotonic=True)
                    if fam.type == "counter" else Gauge(data_points=points))
        else:
            continue
        out.append(Metric(name=name, description=fam.documentation, unit=unit, data=data))
    scope = ScopeMetrics(scope=InstrumentationScope("slogate.gateway"), metrics=out, schema_url="")
    return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")])


class OtelMetrics:
    """Periodic OTLP/HTTP export of a registry; a gateway lifecycle sink (start, close) that gets no records."""

    def __init__(self, registry: CollectorRegistry, start_unix: float, exporter: Any = None,
                 interval_s: float | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
        except ImportError:
            raise UsageError("--otel needs the OpenTelemetry SDK: pip install 'slogate[otel]'") from None
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter()  # OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT, _HEADERS, _TIMEOUT
        if interval_s is None:
            raw = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", str(DEFAULT_INTERVAL_MS))
            try:
                interval_s = float(raw) / 1000.0
            except ValueError:
                raise UsageError(f"bad OTEL_METRIC_EXPORT_INTERVAL={raw!r}: milliseconds, e.g. 60000") from None
            if interval_s <= 0:
                raise UsageError(f"bad OTEL_METRIC_EXPORT_INTERVAL={raw!r}: must be > 0 ms, e.g. 60000")
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "slogate-gateway"}))
        self.registry, self.exporter, self.resource = registry, exporter, resource
        self.interval_s = interval_s
        self.start_unix_ns = int(start_unix * 1e9)
        self._task: asyncio.Task | None = None

    def snapshot(self) -> Any:
        """The registry now, as MetricsData (on the event loop: the families read its plain counters)."""
        return metrics_data(self.registry.collect(), self.start_unix_ns, time.time_ns(), self.resource)

    async def export_once(self) -> None:
        data = self.snapshot()
        result = await in_daemon_thread(lambda: self.exporter.export(data), "OTLP metrics export")
        if getattr(result, "name", "SUCCESS") != "SUCCESS":
            log.warning("OTLP metrics export failed (%s); retrying at the next interval", result.name)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.export_once()
            except Exception as exc:  # an exporter bug or a dead collector must not stop the gateway
                log.warning("OTLP metrics export failed: %s", exc)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        data = self.snapshot()  # the final numbers, sent with the shutdown (bounded: a dead collector must not
        exporter = self.exporter  # hold the exit)

        def last() -> None:
            with contextlib.suppress(Exception):
                exporter.export(data)
            exporter.shutdown()

        await bounded_shutdown(last, "OTLP metrics")

    def submit(self, record: Any, context: object = None) -> None:
        pass  # metrics come from the registry, not per record

    def reopen(self) -> None:
        pass
