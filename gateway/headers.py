"""Which request and response headers the gateway forwards: all of them minus the hop-by-hop ones.

Pure functions over a header mapping (RFC 9110 §7.6.1 plus any named in `Connection`). Never reads
or logs header values beyond `Connection`; they may hold API keys.
"""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict

from slogate.traces.http1 import Head

# RFC 9110 §7.6.1 connection-specific fields, plus the pre-standard Proxy-Connection.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
# When the gateway injects include_usage it must be able to read (and strip) the stream: ask for identity.
_REQUEST_DROP_INJECTED = _REQUEST_DROP | {"accept-encoding"}


def _drop_set(headers: Any, base: frozenset[str]) -> frozenset[str]:
    """Hop-by-hop names plus any listed in the Connection header."""
    conn = headers.get("Connection")
    if not conn:
        return base
    return base | {t.strip().lower() for t in conn.split(",") if t.strip()}


def forward_request_headers(headers: Any, *, injected: bool = False) -> CIMultiDict[str]:
    drop = _drop_set(headers, _REQUEST_DROP_INJECTED if injected else _REQUEST_DROP)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


CONTROL_PREFIX = "x-slogate-"  # slogate's own request controls (priority, the simulator's faults)


def has_control_headers(headers: Any) -> bool:
    return any(k[:10].lower() == CONTROL_PREFIX for k in headers)


def without_control_headers(headers: Any) -> CIMultiDict[str]:
    """`headers` minus every `x-slogate-*` one (from a client not trusted to send them)."""
    return CIMultiDict((k, v) for k, v in headers.items() if k[:10].lower() != CONTROL_PREFIX)


_HOP_BY_HOP_B = frozenset(n.encode() for n in HOP_BY_HOP)
_RESPONSE_DROP_LENGTH = _HOP_BY_HOP_B | {b"content-length"}


def forward_response_fields(head: Head, *, drop_length: bool) -> bytes:
    """The upstream's response field lines as received (bytes unchanged), minus the hop-by-hop ones
    (and Content-Length, which the gateway writes itself)."""
    return head.forward_fields(_RESPONSE_DROP_LENGTH if drop_length else _HOP_BY_HOP_B)
