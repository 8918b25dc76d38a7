"""The ext_proc messages slogate's EPP reads and writes, in protobuf wire format: bytes in, bytes out.

Only the fields the EPP uses of `envoy.service.ext_proc.v3.ProcessingRequest` / `ProcessingResponse`
(field numbers of Envoy's external_processor.proto); unknown fields are skipped as protobuf requires.
A generated codec (envoy-data-plane's betterproto2 classes) costs 0.3–1.5 ms per message in
Python, which would be most of the EPP's CPU; tests/gateway/test_epp_messages.py checks this codec
against those classes field by field. Never decides anything (gateway/epp/exchange.py does).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD = "Process"
# Gateway API Inference Extension: the chosen endpoint, as a header (ORIGINAL_DST reads it) and as
# dynamic metadata under the namespace its protocol names.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
METADATA_NAMESPACE = "envoy.lb"

# ProcessingRequest's oneof `request`: field number -> kind
KINDS = {2: "request_headers", 3: "response_headers", 4: "request_body", 5: "response_body",
         6: "request_trailers", 7: "response_trailers"}
_HEADERS, _BODY, _TRAILERS = frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})
OVERWRITE_IF_EXISTS_OR_ADD = 2  # HeaderValueOption.HeaderAppendAction
# ProcessingRequest.attributes (map<string, Struct>): what the filter's `request_attributes` asks
# Envoy to send; the EPP reads the client's address (for --trust-header-from) and nothing else.
ATTRIBUTES = 9
SOURCE_ADDRESS = b"source.address"


class Incoming:
    """One decoded ProcessingRequest: its kind and the part of it the EPP reads."""

    __slots__ = ("body", "end_of_stream", "headers", "kind", "source")

    def __init__(self, kind: str | None, headers: dict[str, str] | None = None, body: bytes = b"",
                 end_of_stream: bool = False, source: str | None = None) -> None:
        self.kind = kind  # None: a message kind this EPP does not handle (answered with nothing)
        self.headers = headers  # headers and trailers: lower-case names, pseudo-headers included
        self.body = body
        self.end_of_stream = end_of_stream
        self.source = source  # the client's IP (Envoy's `source.address` attribute), when Envoy sends it


# ------------------------------------------------------------------------------------ decoding
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    value, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value): an int for varints, bytes for length-delimited; fixed-width skipped."""
    i, n = 0, len(buf)
    while i < n:
        tag, i = _varint(buf, i)
        wire = tag & 7
        if wire == 2:
            size, i = _varint(buf, i)
            yield tag >> 3, 2, buf[i:i + size]
            i += size
        elif wire == 0:
            value, i = _varint(buf, i)
            yield tag >> 3, 0, value
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wire} not supported")


def _header_map(buf: bytes, out: dict[str, str]) -> None:
    """HeaderMap{repeated HeaderValue headers = 1}; HeaderValue{key = 1, value = 2, raw_value = 3}.
    A repeated name keeps its values joined by ", " (as HTTP allows)."""
    for num, _, hv in _fields(buf):
        if num != 1:
            continue
        key = value = ""
        raw: bytes | None = None
        for f, _, v in _fields(hv):  # type: ignore[arg-type]
            if f == 1:
                key = v.decode()  # type: ignore[union-attr]
            elif f == 2:
                value = v.decode()  # type: ignore[union-attr]
            elif f == 3:
                raw = v  # type: ignore[assignment]
        if raw:
            value = raw.decode("latin-1")
        old = out.get(key)
        out[key] = value if old is None else f"{old}, {value}"


def decode(data: bytes) -> Incoming:
    out: Incoming | None = None
    source: str | None = None
    for num, wire, sub in _fields(data):
        if wire != 2:
            continue
        if num == ATTRIBUTES:
            source = _source_address(sub)  # type: ignore[arg-type]
        elif num in KINDS and out is None:
            out = _request(num, sub)  # type: ignore[arg-type]
    if out is None:
        return Incoming(None)
    out.source = source
    return out


def _request(num: int, sub: bytes) -> Incoming:
    kind = KINDS[num]
    if num in _BODY:  # HttpBody{bytes body = 1; bool end_of_stream = 2}
        body, end = b"", False
        for f, _, v in _fields(sub):
            if f == 1:
                body = v  # type: ignore[assignment]
            elif f == 2:
                end = bool(v)
        return Incoming(kind, body=body, end_of_stream=end)
    headers: dict[str, str] = {}
    end = False
    for f, w, v in _fields(sub):
        if f == 1 and w == 2:  # HttpHeaders.headers / HttpTrailers.trailers: a HeaderMap
            _header_map(v, headers)  # type: ignore[arg-type]
        elif f == 3 and w == 0 and num in _HEADERS:
            end = bool(v)
    return Incoming(kind, headers=headers, end_of_stream=end)


def _source_address(entry: bytes) -> str | None:
    """One `attributes` map entry {string key = 1; Struct value = 2}: the IP of its `source.address`
    (Struct{map<string, Value> fields = 1}, Value.string_value = 3, "IP:PORT" or "[IPv6]:PORT")."""
    for f, _, struct in _fields(entry):
        if f != 2:
            continue
        for g, _, field in _fields(struct):  # type: ignore[arg-type]
            if g != 1:
                continue
            key = value = b""
            for h, _, v in _fields(field):  # type: ignore[arg-type]
                if h == 1:
                    key = v  # type: ignore[assignment]
                elif h == 2:
                    value = v  # type: ignore[assignment]
            if key != SOURCE_ADDRESS:
                continue
            for h, _, v in _fields(value):
                if h == 3:
                    text = v.decode()  # type: ignore[union-attr]
                    host = text.rsplit(":", 1)[0] if text.count(":") == 1 or text.startswith("[") else text
                    return host.strip("[]")
    return None


# ------------------------------------------------------------------------------------ encoding
def _uvarint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _msg(num: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, bytes or a string), present even when empty."""
    return _uvarint(num << 3 | 2) + _uvarint(len(payload)) + payload


def _bytes(num: int, payload: bytes) -> bytes:
    """A proto3 scalar bytes/string field: omitted when empty."""
    return _msg(num, payload) if payload else b""


def _bool(num: int, value: bool) -> bytes:
    return bytes((num << 3, 1)) if value else b""


def _enum(num: int, value: int) -> bytes:
    return _uvarint(num << 3) + _uvarint(value) if value else b""


def _mutation(set_headers: Iterable[tuple[str, str]], remove: Iterable[str]) -> bytes:
    """HeaderMutation{repeated HeaderValueOption set_headers = 1; repeated string remove_headers = 2}."""
    out = b"".join(
        _msg(1, _msg(1, _bytes(1, k.encode()) + _bytes(3, v.encode("latin-1")))
             + _enum(3, OVERWRITE_IF_EXISTS_OR_ADD))
        for k, v in set_headers)
    return out + b"".join(_msg(2, name.encode()) for name in remove)


def _common(mutation: bytes = b"", body_mutation: bytes | None = None) -> bytes:
    """CommonResponse{HeaderMutation header_mutation = 2; BodyMutation body_mutation = 3}."""
    out = _msg(2, mutation) if mutation else b""
    return out + (_msg(3, body_mutation) if body_mutation is not None else b"")


def _struct(fields: dict[str, bytes]) -> bytes:
    """google.protobuf.Struct{map<string, Value> fields = 1}, values already encoded."""
    return b"".join(_msg(1, _msg(1, k.encode()) + _msg(2, v)) for k, v in fields.items())


def route_to(endpoint: str, *, set_headers: Iterable[tuple[str, str]] = (), remove: Iterable[str] = ()) -> bytes:
    """The answer to the request headers: the destination header (plus any other mutation) and the
    same endpoint in `envoy.lb` dynamic metadata."""
    mutation = _mutation([(DESTINATION_HEADER, endpoint), *set_headers], remove)
    inner = _struct({DESTINATION_HEADER: _msg(3, endpoint.encode())})  # Value.string_value = 3
    meta = _struct({METADATA_NAMESPACE: _msg(5, inner)})  # Value.struct_value = 5
    return _msg(1, _msg(1, _common(mutation))) + _msg(8, meta)


def _streamed(num: int, data: bytes, end: bool) -> bytes:
    """ProcessingResponse.<num> = BodyResponse{CommonResponse{BodyMutation{StreamedBodyResponse
    streamed_response = 3 {bytes body = 1; bool end_of_stream = 2}}}}."""
    streamed = _bytes(1, data) + _bool(2, end)
    return _msg(num, _msg(1, _common(body_mutation=_msg(3, streamed))))


def request_body(data: bytes, end: bool) -> bytes:
    """Full-duplex streamed mode: the request body Envoy forwards is the one the EPP sends back."""
    return _streamed(3, data, end)


def response_body(data: bytes, end: bool) -> bytes:
    return _streamed(4, data, end)


def response_headers(*, remove: Iterable[str] = ()) -> bytes:
    return _msg(2, _msg(1, _common(_mutation((), remove))))


def request_trailers() -> bytes:
    return _msg(5, b"")


def response_trailers() -> bytes:
    return _msg(6, b"")


def immediate(status: int, body: bytes, headers: Iterable[tuple[str, str]] = (), *,
              content_type: str = "application/json", details: str = "") -> bytes:
    """Envoy answers the client itself (429 when the pool is saturated, 503 when it is empty):
    ImmediateResponse{HttpStatus status = 1; HeaderMutation headers = 2; bytes body = 3; string details = 5}."""
    mutation = _mutation([("content-type", content_type), *headers], ())
    out = _msg(1, _enum(1, status)) + _msg(2, mutation) + _bytes(3, body) + _bytes(5, details.encode())
    return _msg(7, out)
