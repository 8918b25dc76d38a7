"""OTLP metrics of a real gateway (`--otel`): the /metrics families reach a real OTLP/HTTP receiver with
the GenAI semconv instrument names and attributes, the same series and the same counts as /metrics.

The receiver decodes `ExportMetricsServiceRequest` protobufs with opentelemetry-proto: the bytes the
SDK's OTLP/HTTP exporter sends.
"""

from __future__ import annotations

import orjson
import pytest

from slogate.gateway.live_metrics import DURATION_BUCKETS, LiveMetrics, MetricsCollector, make_registry
from slogate.gateway.otel_metrics import ATTRIBUTES, INSTRUMENTS, OtelMetrics
from slogate.traces.usage import UsageError
from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, metric_samples, start_gateway, wait_for
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)




def _exports(otlp) -> list[tuple[str | None, dict]]:
    """(service.name, {metric name: Metric}) per metrics export received so far."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    out = []
    for body in list(otlp.bodies.get("/v1/metrics", [])):
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            service = {a.key: a.value.string_value for a in rm.resource.attributes}.get("service.name")
            out.append((service, {m.name: m for sm in rm.scope_metrics for m in sm.metrics}))
    return out


def _attrs(point) -> frozenset:
    return frozenset((a.key, a.value.string_value) for a in point.attributes)


def _duration_count(metrics: dict) -> int:
    m = metrics.get("gen_ai.server.request.duration")
    return sum(p.count for p in m.histogram.data_points) if m is not None else 0


def test_otlp_metrics_match_the_metrics_endpoint(otlp) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_SERVICE_NAME": "gw-metrics",
           "OTEL_METRIC_EXPORT_INTERVAL": "200", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, start_gateway(sim.url, "--otel", env=env) as gw:
        for i, stream in enumerate((True, True, False)):
            body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4,
                    "stream": stream}
            assert http_request(gw.url, "POST", "/v1/chat/completions", orjson.dumps(body),
                                {"Content-Type": "application/json"})[0] == 200
        samples = metric_samples(gw.admin_url)
        wait_for(lambda: any(_duration_count(m) == 3 for _, m in _exports(otlp)), timeout=15)
    service, metrics = next((s, m) for s, m in _exports(otlp) if _duration_count(m) == 3)
    assert service == "gw-metrics"
    for prom, (name, unit) in INSTRUMENTS.items():
        m = metrics[name]
        assert m.unit == unit and m.histogram.aggregation_temporality == 2  # CUMULATIVE
        # The same series as /metrics, labels translated to semconv attributes, with the same counts.
        expected = {frozenset((ATTRIBUTES.get(k, k), v) for k, v in labels.items() if v): n  # "": no label
                    for labels, n in samples[f"{prom}_count"]}
        got = {_attrs(p): p.count for p in m.histogram.data_points}
        assert got == expected, name
    duration = metrics["gen_ai.server.request.duration"].histogram.data_points[0]
    assert list(duration.explicit_bounds) == list(DURATION_BUCKETS)
    assert len(duration.bucket_counts) == len(DURATION_BUCKETS) + 1 and sum(duration.bucket_counts) == 3
    assert not duration.HasField("min") and not duration.HasField("max")  # not measured: not invented
    attrs = dict(_attrs(duration))
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == SIM_MODEL
    assert attrs["gen_ai.response.model"] == SIM_MODEL and "error.type" not in attrs  # success: no error.type
    requests = metrics["slogate_requests"].sum
    assert requests.is_monotonic and sum(p.as_int or p.as_double for p in requests.data_points) == 3
    assert not [n for n in metrics if n.startswith("process_")]
    assert "slogate_build_info" in metrics


class _Exporter:
    def __init__(self) -> None:
        self.data: list = []

    def export(self, data):  # type: ignore[no-untyped-def]
        self.data.append(data)

    def shutdown(self) -> None:
        pass


def test_snapshot_counts_and_bad_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from slogate.traces.record import RequestRecord

    live = LiveMetrics([])
    for e2e in (0.05, 0.5, 5.0):
        live.observe(RequestRecord(t=0.0, model="m", e2e=e2e, output_tokens=2), (), None)
    registry = make_registry(MetricsCollector(live, lambda: [], lambda: None))
    data = OtelMetrics(registry, 0.0, exporter=_Exporter(), interval_s=1.0).snapshot()
    metrics = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
    point = metrics["gen_ai.server.request.duration"].data.data_points[0]
    assert point.count == 3 and point.sum == pytest.approx(5.55)
    assert sum(point.bucket_counts) == 3 and point.bucket_counts[-1] == 0  # 5 s is inside the finite buckets
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "soon")
    with pytest.raises(UsageError, match=r"bad OTEL_METRIC_EXPORT_INTERVAL='soon': milliseconds"):
        OtelMetrics(registry, 0.0, exporter=_Exporter())
