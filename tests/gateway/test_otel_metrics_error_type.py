"""OTLP metrics of a real gateway carry `error.type` only on failed requests, as the GenAI semconv says
(conditionally required: "if the operation ended in an error").

/metrics gives successful requests `error_type=""`, which Prometheus reads as no label at all; exported as
is, every successful request's OTLP point had an `error.type` attribute (empty), so an OTLP backend
counting points with `error.type` counted every request as failed. Counts and sums stay those of /metrics.
"""

from __future__ import annotations

import orjson
import pytest

from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, metric_samples, start_gateway, wait_for
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


def _duration_points(otlp) -> list:  # type: ignore[no-untyped-def]
    """The gen_ai.server.request.duration points of the latest metrics export (none before one)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    bodies = list(otlp.bodies.get("/v1/metrics", []))
    if not bodies:
        return []
    request = ExportMetricsServiceRequest.FromString(bodies[-1])
    return [p for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "gen_ai.server.request.duration" for p in m.histogram.data_points]


def test_error_type_only_on_failed_requests(otlp) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_METRIC_EXPORT_INTERVAL": "200",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, start_gateway(sim.url, "--otel", env=env) as gw:
        body = orjson.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        for fault in (None, None, "error=500"):
            headers = {"Content-Type": "application/json", **({"x-slogate-fault": fault} if fault else {})}
            assert http_request(gw.url, "POST", "/v1/chat/completions", body, headers)[0] == (500 if fault else 200)
        samples = metric_samples(gw.admin_url)
        assert wait_for(lambda: sum(p.count for p in _duration_points(otlp)) == 3, timeout=15)
        points = _duration_points(otlp)
    by_error = {}
    for p in points:
        attrs = {a.key: a.value.string_value for a in p.attributes}
        assert all(v != "" for v in attrs.values()), attrs  # no empty attribute at all
        by_error[attrs.get("error.type")] = (p.count, p.sum)
    prom = {labels["error_type"] or None: (n, s) for (labels, n), (_, s) in zip(
        samples["gen_ai_server_request_duration_seconds_count"],
        samples["gen_ai_server_request_duration_seconds_sum"], strict=True)}
    assert set(by_error) == {None, "upstream_status"}
    assert by_error[None][0] == 2 and by_error["upstream_status"][0] == 1
    for key, (n, s) in prom.items():  # the same counts and sums as /metrics
        assert by_error[key][0] == n and by_error[key][1] == pytest.approx(s), key
