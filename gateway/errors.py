"""Errors the gateway itself answers with, in the OpenAI shape.

Before any response byte reached the client: a JSON body `{"error": {message, type, param, code}}`
with status 413/429/500/502/503/504. After: one SSE `data:` error event then `data: [DONE]`. The
body's `code` is the record's error class (traces.record.ErrorClass), so what a client sees and
what the trace says are one name. Never echoes request content, headers or upstream credentials.
"""

from __future__ import annotations

import orjson

from slogate.gateway.http_server import Reply
from slogate.traces.record import ErrorClass

# The error classes the gateway itself answers (record.error) -> (HTTP status, OpenAI error type, message).
# `rejected` is answered by gateway.routing.admission (429 with Retry-After; its body's code says why).
ERRORS: dict[ErrorClass, tuple[int, str, str]] = {
    "request_too_large": (413, "invalid_request_error", "request body exceeds the gateway limit"),
    "rejected": (429, "rate_limit_exceeded", "all upstreams are at their in-flight limit"),
    "connect": (502, "upstream_error", "could not connect to the upstream server"),
    "protocol": (502, "upstream_error", "the upstream server sent an invalid HTTP response"),
    "reset": (502, "upstream_error", "the upstream server closed the connection"),
    "timeout_connect": (504, "timeout", "timed out connecting to the upstream server"),
    "timeout_ttfb": (504, "timeout", "the upstream server did not start responding in time"),
    "timeout_idle": (504, "timeout", "the upstream server stopped sending in the middle of the response"),
    "timeout_total": (504, "timeout", "the request exceeded the gateway's total time limit"),
    "shutdown": (503, "server_error", "the gateway is shutting down"),
    "gateway_error": (500, "server_error", "internal gateway error"),
}


def _payload(code: ErrorClass, detail: str | None) -> dict:
    _, kind, message = ERRORS[code]
    if detail:
        message = f"{message} ({detail})"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def status_of(code: ErrorClass) -> int:
    return ERRORS[code][0]


def json_error(code: ErrorClass, detail: str | None = None, *, close: bool = False) -> Reply:
    """The JSON error response sent when no byte of the upstream response was forwarded yet."""
    return Reply(ERRORS[code][0], orjson.dumps(_payload(code, detail)), close=close)


def sse_error(code: ErrorClass, detail: str | None = None, *, new_event: bool = True) -> bytes:
    """Error event then [DONE] for a stream already under way. `new_event=False` first closes
    a partially forwarded event so the error starts on a fresh one."""
    lead = b"" if new_event else b"\n\n"
    return lead + b"data: " + orjson.dumps(_payload(code, detail)) + b"\n\ndata: [DONE]\n\n"
