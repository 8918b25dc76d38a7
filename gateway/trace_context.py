"""W3C trace context through the gateway (`--otel`): the gateway's span is the upstream request's parent.

`child_traceparent` makes the `traceparent` sent upstream: the client's trace (or a new one), with the
span id of the span the gateway records for the request, so the engine's spans become its children, as
behind Envoy. `TraceContext` carries what the span needs to the OTel sink. Never reads or writes content.
"""

from __future__ import annotations

import os
import re

import msgspec

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class TraceContext(msgspec.Struct, frozen=True):
    """A request's trace context: the client's `traceparent`/`tracestate` (the span's parent, as received)
    and the ids of the gateway's span when they were sent upstream (None: not propagated)."""

    parent: str | None = None
    state: str | None = None
    trace_id: str | None = None
    span_id: str | None = None


def child_traceparent(incoming: str | None) -> tuple[bytes, str, str]:
    """(the `traceparent` to send upstream, its trace id, its span id): a valid incoming trace is continued
    (its flags kept), anything else starts a new, sampled one; the span id is new either way."""
    m = _TRACEPARENT.fullmatch(incoming.strip().lower()) if incoming else None
    if m is not None and m[1] != _ZERO_TRACE and m[2] != _ZERO_SPAN:
        trace_id, flags = m[1], m[3]
    else:
        trace_id, flags = _nonzero(16), "01"
    span_id = _nonzero(8)
    return f"00-{trace_id}-{span_id}-{flags}".encode(), trace_id, span_id


def _nonzero(n: int) -> str:
    while True:
        value = os.urandom(n).hex()
        if value.strip("0"):
            return value
