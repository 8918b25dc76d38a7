"""With `--otel` the gateway's span is the parent of the engine's work, as behind Envoy: the upstream
request carries a `traceparent` of the client's trace (or a new one) whose span id is the span the
gateway exports for the request. Before, the client's header went upstream unchanged (the engine's
spans were the gateway span's siblings) and without one the two traces never joined.

The upstream here is a tiny HTTP server that records the `traceparent` it was sent (no sim reports it)."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import orjson
import pytest

from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, start_gateway, wait_for
from tests.gateway.test_access_log_otel import TRACE_ID, TRACEPARENT, _spans
from tests.servers import serve_in_thread

pytestmark = pytest.mark.timeout(60)

_BODY = orjson.dumps({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": SIM_MODEL,
                      "choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


@pytest.fixture
def recording_upstream() -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("traceparent"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(_BODY)))
            self.end_headers()
            self.wfile.write(_BODY)

        def log_message(self, *args: object) -> None:
            pass

    with serve_in_thread(Handler) as url:
        yield url, seen


def _completion(url: str, headers: dict[str, str]) -> int:
    body = orjson.dumps({"model": SIM_MODEL, "prompt": "hello", "max_tokens": 1})
    return http_request(url, "POST", "/v1/completions", body, {"Content-Type": "application/json", **headers})[0]


def test_the_gateway_span_is_the_parent_of_the_upstream_request(otlp, recording_upstream) -> None:
    upstream, seen = recording_upstream
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with start_gateway(upstream, "--otel", env=env) as gw:
        assert _completion(gw.url, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}) == 200
        assert _completion(gw.url, {}) == 200
        assert wait_for(lambda: len(_spans(otlp)) == 2)
    spans = {span.span_id.hex(): span for _, span in _spans(otlp)}
    continued, started = seen  # what the upstream was sent, in request order
    assert continued is not None and started is not None
    version, trace_id, span_id, flags = continued.split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert span_id != TRACEPARENT.split("-")[2]  # not the client's span: the gateway's
    span = spans[span_id]  # the exported span is the one named upstream
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == TRACEPARENT.split("-")[2]
    assert span.trace_state == "vendor=1"  # the client's tracestate goes on with its trace
    _, trace_id, span_id, flags = started.split("-")
    root = spans[span_id]  # no client context: a new trace, the gateway span its root
    assert root.trace_id.hex() == trace_id != TRACE_ID and not root.parent_span_id and flags == "01"


def test_without_otel_the_client_traceparent_goes_upstream_unchanged(recording_upstream) -> None:
    upstream, seen = recording_upstream
    with start_gateway(upstream) as gw:
        assert _completion(gw.url, {"traceparent": TRACEPARENT}) == 200
        assert _completion(gw.url, {}) == 200
    assert seen == [TRACEPARENT, None]
