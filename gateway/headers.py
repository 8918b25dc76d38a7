"""Which request and response headers the gateway forwards: all of them minus the hop-by-hop ones.

Pure functions over a header mapping (RFC 9110 §7.6.1 plus any named in `Connection`). Never reads
or logs header values beyond `Connection`; they may hold API keys.
"""

from __future__ import annotations

from collections.abc import Iterator

from slogate.traces.http1 import Head

# RFC 9110 §7.6.1 connection-specific fields, plus the pre-standard Proxy-Connection.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
# When the gateway injects include_usage it must be able to read (and strip) the stream: ask for identity.
_REQUEST_DROP_INJECTED = _REQUEST_DROP | {"accept-encoding"}


CONTROL_PREFIX = "x-slogate-"  # slogate's own request controls (priority, the simulator's faults)
_CONTROL_PREFIX_B = CONTROL_PREFIX.encode()
_REQUEST_DROP_B = frozenset(n.encode() for n in _REQUEST_DROP)
_REQUEST_DROP_INJECTED_B = frozenset(n.encode() for n in _REQUEST_DROP_INJECTED)


_KEYS: dict[str, bytes] = {}  # header name as asked → lowercased field-name bytes (RequestFields.get)


class RequestFields:
    """A request's header fields as received, `(lowercased name, name, value)` bytes each: forwarded
    as bytes (never decoded and re-encoded), looked up case-insensitively (values decoded latin-1)."""

    __slots__ = ("control", "fields")

    def __init__(self, fields: list[tuple[bytes, bytes, bytes]]) -> None:
        self.fields = fields
        self.control = any(k[:10] == _CONTROL_PREFIX_B for k, _, _ in fields)  # any x-slogate-* field

    def get(self, name: str, default: str | None = None) -> str | None:
        key = _KEYS.get(name)
        if key is None:
            key = name.lower().encode("latin-1")
            if len(_KEYS) < 64:  # the gateway asks for a handful of fixed names: encoded once
                _KEYS[name] = key
        for k, _, v in self.fields:
            if k == key:
                return v.decode("latin-1")
        return default

    def getall(self, name: str) -> list[str]:
        key = name.lower().encode("latin-1")
        return [v.decode("latin-1") for k, _, v in self.fields if k == key]

    def items(self) -> list[tuple[str, str]]:
        return [(n.decode("latin-1"), v.decode("latin-1")) for _, n, v in self.fields]

    def __iter__(self) -> Iterator[str]:
        return (n.decode("latin-1") for _, n, _ in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def without_control(self) -> RequestFields:
        """These fields minus every `x-slogate-*` one (from a client not trusted to send them)."""
        return RequestFields([f for f in self.fields if f[0][:10] != _CONTROL_PREFIX_B])


def forward_request_fields(headers: RequestFields, *, injected: bool = False, traceparent: bytes | None = None) -> bytes:
    """The field lines the gateway sends upstream (bytes as received), minus hop-by-hop ones, Host,
    Content-Length and Expect (written by the gateway), any named in Connection, and Accept-Encoding
    when the gateway injected include_usage (it must read the stream). `traceparent` (--otel) replaces
    the client's: the gateway's span is the upstream request's parent."""
    drop = _REQUEST_DROP_INJECTED_B if injected else _REQUEST_DROP_B
    conn = headers.get("Connection")
    if conn:
        drop = drop | {t.strip().lower().encode("latin-1") for t in conn.split(",") if t.strip()}
    if traceparent is not None:
        drop = drop | {b"traceparent"}
    fields = b"".join([b"%s: %s\r\n" % (name, value) for key, name, value in headers.fields if key not in drop])
    return fields if traceparent is None else fields + b"traceparent: " + traceparent + b"\r\n"


_HOP_BY_HOP_B = frozenset(n.encode() for n in HOP_BY_HOP)
_RESPONSE_DROP_LENGTH = _HOP_BY_HOP_B | {b"content-length"}


def forward_response_fields(head: Head, *, drop_length: bool) -> bytes:
    """The upstream's response field lines as received (bytes unchanged), minus the hop-by-hop ones
    (and Content-Length, which the gateway writes itself)."""
    return head.forward_fields(_RESPONSE_DROP_LENGTH if drop_length else _HOP_BY_HOP_B)
