"""Errors the gateway itself answers with, in the OpenAI shape.

Before any response byte reached the client: a JSON body `{"error": {message, type, param, code}}`
with status 413/502/504. After: one SSE `data:` error event then `data: [DONE]`. Never echoes
request content, headers or upstream credentials in a message.
"""

from __future__ import annotations

import orjson
from aiohttp import web

# error class (record.error) -> (HTTP status, OpenAI error type, message)
ERRORS: dict[str, tuple[int, str, str]] = {
    "request_too_large": (413, "invalid_request_error", "request body exceeds the gateway limit"),
    "upstream_connect": (502, "upstream_error", "could not connect to the upstream server"),
    "upstream_error": (502, "upstream_error", "the upstream server failed before responding"),
    "reset": (502, "upstream_error", "the upstream server closed the connection"),
    "timeout_connect": (504, "timeout", "timed out connecting to the upstream server"),
    "timeout_ttfb": (504, "timeout", "the upstream server did not start responding in time"),
    "timeout_idle": (504, "timeout", "the upstream server stopped sending in the middle of the response"),
    "timeout_total": (504, "timeout", "the request exceeded the gateway's total time limit"),
    "shutdown": (503, "server_error", "the gateway is shutting down"),
    "gateway_error": (500, "server_error", "internal gateway error"),
}


def _payload(code: str, detail: str | None) -> dict:
    _, kind, message = ERRORS[code]
    if detail:
        message = f"{message} ({detail})"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def status_of(code: str) -> int:
    return ERRORS[code][0]


def json_error(code: str, detail: str | None = None) -> web.Response:
    """The JSON error response sent when no byte of the upstream response was forwarded yet."""
    return web.Response(
        status=ERRORS[code][0],
        body=orjson.dumps(_payload(code, detail)),
        content_type="application/json",
    )


def sse_error(code: str, detail: str | None = None, *, new_event: bool = True) -> bytes:
    """Error event then [DONE] for a stream already under way. `new_event=False` first closes
    a partially forwarded event so the error starts on a fresh one."""
    lead = b"" if new_event else b"\n\n"
    return lead + b"data: " + orjson.dumps(_payload(code, detail)) + b"\n\ndata: [DONE]\n\n"
