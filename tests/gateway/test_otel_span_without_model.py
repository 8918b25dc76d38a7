"""A span whose request model is not known (body refused before it was read, not JSON, no "model") is
named `{gen_ai.operation.name}` and has no `gen_ai.request.model`, as the GenAI semconv says ("if
available"); it used to be named "chat none" with `gen_ai.request.model` and `gen_ai.response.model`
"none", a made-up model. The upstream's answered model is still the response model.
"""

from __future__ import annotations

import orjson
import pytest

from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, start_gateway, wait_for
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


def _spans(otlp) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    """(name, attributes) of every span received so far."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    for body in list(otlp.bodies.get("/v1/traces", [])):
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            for ss in rs.scope_spans:
                out += [(s.name, {a.key: a.value for a in s.attributes}) for s in ss.spans]
    return out


def test_span_without_a_known_model(otlp) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    headers = {"Content-Type": "application/json"}
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            start_gateway(sim.url, "--otel", "--max-body-bytes", "400", env=env) as gw:
        cases = (  # body, status
            ({"model": SIM_MODEL, "messages": [{"role": "user", "content": "x" * 500}]}, 413),  # never read
            ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, 200),  # no "model"
            ({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, 200),
        )
        for body, status in cases:
            assert http_request(gw.url, "POST", "/v1/chat/completions", orjson.dumps(body), headers)[0] == status
        assert http_request(gw.url, "POST", "/v1/chat/completions", b'{"model": ', headers)[0] == 400  # not JSON
        assert wait_for(lambda: len(_spans(otlp)) == 4)
    spans = _spans(otlp)
    assert sorted(name for name, _ in spans) == ["chat", "chat", "chat", f"chat {SIM_MODEL}"]
    for name, attrs in spans:
        request_model = attrs.get("gen_ai.request.model")
        response_model = attrs.get("gen_ai.response.model")
        if request_model is not None:
            assert name == f"chat {SIM_MODEL}" and request_model.string_value == SIM_MODEL
            continue
        assert name == "chat", name
        status = attrs["http.response.status_code"].int_value
        if status == 200:  # the upstream answered with its model
            assert response_model is not None and response_model.string_value == SIM_MODEL
        else:  # 413, 400: no model anywhere
            assert response_model is None, (status, response_model)
            assert attrs["error.type"].string_value in ("request_too_large", "upstream_status")
