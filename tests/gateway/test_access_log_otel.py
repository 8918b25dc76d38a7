"""Access log and OTLP spans of a real gateway: one JSON line per request with no content, reopened on
SIGHUP; one span per request reaching a real OTLP/HTTP receiver, continuing the incoming traceparent.

The receiver is a tiny HTTP server in the test that decodes `ExportTraceServiceRequest` protobufs with
opentelemetry-proto, i.e. the bytes the SDK's OTLP/HTTP exporter actually sends.
"""

from __future__ import annotations

import json
import os
import signal

import orjson
import pytest

from tests.gateway.fixtures_gateway import CANARY, SIM_MODEL, http_request, start_gateway, wait_for
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _chat(url: str, i: int, headers: dict[str, str] | None = None, stream: bool = True) -> int:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": f"{CANARY} {i}"}], "max_tokens": 4,
            "stream": stream}
    status, _, _ = http_request(url, "POST", "/v1/chat/completions", orjson.dumps(body),
                                {"Content-Type": "application/json", "Authorization": f"Bearer sk-{CANARY}",
                                 **(headers or {})})
    return status


def test_access_log_one_line_per_request_no_canary_and_sighup_reopen(tmp_path) -> None:
    log = tmp_path / "access.jsonl"
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, start_gateway(
        sim.url, "--access-log", str(log), "--log-format", "json"
    ) as gw:
        for i in range(5):
            assert _chat(gw.url, i, stream=i % 2 == 0) == 200
        bad = {"model": "nope", "messages": [{"role": "user", "content": CANARY}]}
        assert http_request(gw.url, "POST", "/v1/chat/completions", orjson.dumps(bad))[0] == 404
        wait_for(lambda: log.exists() and log.read_bytes().count(b"\n") == 6)
        rotated = tmp_path / "access.jsonl.1"
        log.rename(rotated)  # what logrotate does; then SIGHUP makes the gateway open the path again
        gw.proc.send_signal(signal.SIGHUP)
        assert _chat(gw.url, 99) == 200
        wait_for(lambda: log.exists() and log.read_bytes().count(b"\n") == 1)
        stderr_lines = [line for line in gw.log_text().splitlines() if line.strip()]
    lines = [json.loads(x) for x in rotated.read_text().splitlines()]
    assert len(lines) == 6
    ok = [x for x in lines if x["status"] == 200]
    assert len(ok) == 5 and all(x["model"] == SIM_MODEL and x["error"] is None and x["output_tokens"] == 4 for x in ok)
    assert all(x["ttft"] > 0 and x["upstream"] for x in ok if x["stream"])
    assert [x["error"] for x in lines if x["status"] == 404] == ["upstream_status"]
    for text in (rotated.read_text(), log.read_text(), gw.log_text()):
        assert CANARY not in text and "127.0.0.1:" + str(gw.port) not in text
    assert all(set(x) >= {"ts", "endpoint", "status", "error"} for x in lines)
    assert stderr_lines and all(json.loads(line)["logger"] for line in stderr_lines)  # --log-format json




def _spans(otlp) -> list:
    """(service.name, Span) for every span received so far."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    for body in list(otlp.bodies.get("/v1/traces", [])):
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
            out += [(service, span) for ss in rs.scope_spans for span in ss.spans]
    return out


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value or v.int_value or v.double_value or v.bool_value
    return out


def test_otlp_span_per_request_continues_traceparent(otlp) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_SERVICE_NAME": "gw-under-test",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, start_gateway(sim.url, "--otel", env=env) as gw:
        assert _chat(gw.url, 0, {"traceparent": TRACEPARENT}) == 200
        assert _chat(gw.url, 1) == 200
        wait_for(lambda: len(_spans(otlp)) == 2)
    assert {service for service, _ in _spans(otlp)} == {"gw-under-test"}
    by_trace = {span.trace_id.hex(): span for _, span in _spans(otlp)}
    assert TRACE_ID in by_trace  # continues the incoming trace; the other request starts its own
    span = by_trace[TRACE_ID]
    assert span.parent_span_id.hex() == "00f067aa0ba902b7"
    attrs = _attrs(span)
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == SIM_MODEL
    assert attrs["gen_ai.provider.name"] == "openai" and attrs["slogate.outcome"] == "ok"
    assert attrs["gen_ai.usage.output_tokens"] == 4 and attrs["slogate.upstream"]
    events = [e for e in span.events if e.name == "gen_ai.server.first_token"]
    assert len(events) == 1 and span.start_time_unix_nano < events[0].time_unix_nano <= span.end_time_unix_nano
    for _, s in _spans(otlp):
        assert CANARY not in s.SerializeToString().decode("latin-1")


def test_otel_without_sdk_is_a_usage_error() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['opentelemetry'] = None; from slogate.gateway.cli import main; "
            f"sys.exit(main(['--upstream', 'http://127.0.0.1:9', '--listen', '127.0.0.1:{free_port()}', '--otel']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         env={**os.environ})
    assert run.returncode == 2 and "slogate[otel]" in run.stderr, run.stderr
