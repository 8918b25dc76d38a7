"""gateway/epp/messages.py against the generated classes of Envoy's protos (envoy-data-plane,
betterproto2): every request the EPP decodes is built with them, every response it encodes is parsed
by them, field by field. Hypothesis varies bodies, header names and values, flags.
"""

from __future__ import annotations

import warnings

from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # pydantic deprecation warnings of the generated classes at import
    warnings.simplefilter("ignore")
    from envoy_data_plane.envoy.config.core.v3 import (
        HeaderMap,
        HeaderValue,
        HeaderValueOptionHeaderAppendAction,
    )
    from envoy_data_plane.envoy.service.ext_proc.v3 import (
        HttpBody,
        HttpHeaders,
        HttpTrailers,
        ProcessingRequest,
        ProcessingResponse,
    )
    from envoy_data_plane.google.protobuf import Struct, Value

from slogate.gateway.epp import messages as m

names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz-:0123456789"), min_size=1, max_size=24)
values = st.binary(max_size=300).map(lambda b: bytes(c for c in b if 0x20 <= c < 0x7F))
header_lists = st.lists(st.tuples(names, values), max_size=12)
bodies = st.binary(max_size=5000)


def _joined(pairs: list[tuple[str, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in pairs:
        value = v.decode("latin-1")
        out[k] = value if k not in out else f"{out[k]}, {value}"
    return out


@settings(max_examples=150, deadline=None)
@given(pairs=header_lists, end=st.booleans(), which=st.sampled_from(["request_headers", "response_headers"]),
       as_value=st.booleans())
def test_headers_decode_as_the_generated_classes_encode(pairs, end, which, as_value):
    hv = [HeaderValue(key=k, value=v.decode()) if as_value else HeaderValue(key=k, raw_value=v) for k, v in pairs]
    data = bytes(ProcessingRequest(**{which: HttpHeaders(headers=HeaderMap(headers=hv), end_of_stream=end)},
                                   observability_mode=False))
    got = m.decode(data)
    assert got.kind == which and got.end_of_stream == end
    assert got.headers == _joined(pairs)


@settings(max_examples=150, deadline=None)
@given(body=bodies, end=st.booleans(), which=st.sampled_from(["request_body", "response_body"]))
def test_bodies_decode(body, end, which):
    got = m.decode(bytes(ProcessingRequest(**{which: HttpBody(body=body, end_of_stream=end)})))
    assert (got.kind, got.body, got.end_of_stream) == (which, body, end)


@settings(max_examples=100, deadline=None)
@given(ip=st.ip_addresses(), port=st.integers(1, 65535), others=st.dictionaries(names, values, max_size=4),
       pairs=header_lists)
def test_the_source_address_attribute_decodes(ip, port, others, pairs):
    """ProcessingRequest.attributes (sent after the headers, field 9): the IP of source.address."""
    addr = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    fields = {k: Value(string_value=v.decode()) for k, v in others.items() if k != "source.address"}
    fields["source.address"] = Value(string_value=addr)
    hv = [HeaderValue(key=k, raw_value=v) for k, v in pairs]
    data = bytes(ProcessingRequest(request_headers=HttpHeaders(headers=HeaderMap(headers=hv), end_of_stream=True),
                                   attributes={"envoy.filters.http.ext_proc": Struct(fields=fields)}))
    got = m.decode(data)
    assert got.kind == "request_headers" and got.end_of_stream and got.headers == _joined(pairs)
    assert got.source == str(ip)
    assert m.decode(bytes(ProcessingRequest(request_headers=HttpHeaders(end_of_stream=True)))).source is None


def test_trailers_and_unknown_kinds_decode():
    data = bytes(ProcessingRequest(response_trailers=HttpTrailers(
        trailers=HeaderMap(headers=[HeaderValue(key="grpc-status", raw_value=b"0")]))))
    got = m.decode(data)
    assert got.kind == "response_trailers" and got.headers == {"grpc-status": "0"}
    assert m.decode(bytes(ProcessingRequest(observability_mode=True))).kind is None


def _set_headers(mutation) -> dict[str, str]:  # type: ignore[no-untyped-def]
    for o in mutation.set_headers:
        assert o.append_action == HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
    return {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}


@settings(max_examples=100, deadline=None)
@given(body=bodies, end=st.booleans(), which=st.sampled_from(["request_body", "response_body"]))
def test_streamed_bodies_encode(body, end, which):
    data = (m.request_body if which == "request_body" else m.response_body)(body, end)
    parsed = ProcessingResponse.parse(data)
    streamed = getattr(parsed, which).response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (body, end)


def test_route_to_encodes_header_and_envoy_lb_metadata():
    parsed = ProcessingResponse.parse(m.route_to("10.1.2.3:8000", set_headers=[("content-length", "42")],
                                                 remove=["accept-encoding"]))
    mutation = parsed.request_headers.response.header_mutation
    assert _set_headers(mutation) == {"x-gateway-destination-endpoint": "10.1.2.3:8000", "content-length": "42"}
    assert mutation.remove_headers == ["accept-encoding"]
    lb = parsed.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == "10.1.2.3:8000"


def test_response_headers_trailers_and_immediate_encode():
    plain = ProcessingResponse.parse(m.response_headers())
    assert plain.response_headers is not None and plain.response_headers.response.header_mutation is None
    cut = ProcessingResponse.parse(m.response_headers(remove=["content-length"]))
    assert cut.response_headers.response.header_mutation.remove_headers == ["content-length"]
    assert ProcessingResponse.parse(m.request_trailers()).request_trailers is not None
    assert ProcessingResponse.parse(m.response_trailers()).response_trailers is not None
    imm = ProcessingResponse.parse(m.immediate(429, b'{"error":{}}', [("Retry-After", "1")], details="why")
                                   ).immediate_response
    assert imm.status.code.value == 429 and imm.body == b'{"error":{}}' and imm.details == "why"
    assert _set_headers(imm.headers) == {"content-type": "application/json", "Retry-After": "1"}
