"""The ext_proc messages slogate's EPP reads and writes: the one module that imports the protocol types.

Message types come from `envoy-data-plane` (betterproto2 classes generated from Envoy's published
protos; see gateway/epp/README.md for why not `xds-protos`). Builds each response the EPP sends;
never decides anything (gateway/epp/exchange.py does) and never looks at body bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue, HeaderValueOption
from envoy_data_plane.envoy.config.core.v3 import HeaderValueOptionHeaderAppendAction as Append
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Struct, Value

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD = "Process"
# Gateway API Inference Extension: the chosen endpoint, as a header (ORIGINAL_DST reads it) and as
# dynamic metadata under the namespace its protocol names.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
METADATA_NAMESPACE = "envoy.lb"

__all__ = ["METHOD", "SERVICE", "ProcessingRequest", "ProcessingResponse", "decode", "encode"]


def decode(data: bytes) -> ProcessingRequest:
    return ProcessingRequest.parse(data)


def encode(msg: ProcessingResponse) -> bytes:
    return bytes(msg)


def header_dict(headers: HeaderMap | None) -> dict[str, str]:
    """Envoy's header map (lower-case names, pseudo-headers included) as a dict; a repeated name keeps
    its values joined by ", " (as HTTP allows)."""
    out: dict[str, str] = {}
    if headers is None:
        return out
    for h in headers.headers:
        value = h.raw_value.decode("latin-1") if h.raw_value else h.value
        old = out.get(h.key)
        out[h.key] = value if old is None else f"{old}, {value}"
    return out


def _set(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=key, raw_value=value.encode("latin-1")),
                             append_action=Append.OVERWRITE_IF_EXISTS_OR_ADD)


def _mutation(set_headers: Iterable[tuple[str, str]], remove: Iterable[str]) -> HeaderMutation | None:
    sets = [_set(k, v) for k, v in set_headers]
    removes = list(remove)
    return HeaderMutation(set_headers=sets, remove_headers=removes) if sets or removes else None


def route_to(endpoint: str, *, set_headers: Iterable[tuple[str, str]] = (), remove: Iterable[str] = ()
             ) -> ProcessingResponse:
    """The answer to the request headers: the destination header (plus any other mutation) and the
    same endpoint in `envoy.lb` dynamic metadata."""
    mutation = _mutation([(DESTINATION_HEADER, endpoint), *set_headers], remove)
    meta = Struct(fields={METADATA_NAMESPACE: Value(struct_value=Struct(
        fields={DESTINATION_HEADER: Value(string_value=endpoint)}))})
    return ProcessingResponse(request_headers=HeadersResponse(response=CommonResponse(header_mutation=mutation)),
                              dynamic_metadata=meta)


def request_body(data: bytes, end: bool) -> ProcessingResponse:
    """Full-duplex streamed mode: the request body Envoy forwards is the one the EPP sends back."""
    return ProcessingResponse(request_body=_streamed(data, end))


def response_headers(*, remove: Iterable[str] = ()) -> ProcessingResponse:
    return ProcessingResponse(response_headers=HeadersResponse(
        response=CommonResponse(header_mutation=_mutation((), remove))))


def response_body(data: bytes, end: bool) -> ProcessingResponse:
    return ProcessingResponse(response_body=_streamed(data, end))


def _streamed(data: bytes, end: bool) -> BodyResponse:
    return BodyResponse(response=CommonResponse(
        body_mutation=BodyMutation(streamed_response=StreamedBodyResponse(body=data, end_of_stream=end))))


def request_trailers() -> ProcessingResponse:
    return ProcessingResponse(request_trailers=TrailersResponse())


def response_trailers() -> ProcessingResponse:
    return ProcessingResponse(response_trailers=TrailersResponse())


def immediate(status: int, body: bytes, headers: Iterable[tuple[str, str]] = (), *,
              content_type: str = "application/json", details: str = "") -> ProcessingResponse:
    """Envoy answers the client itself (429 when the pool is saturated, 503 when it is empty)."""
    mutation = _mutation([("content-type", content_type), *headers], ())
    return ProcessingResponse(immediate_response=ImmediateResponse(
        status=HttpStatus(code=StatusCode(status)), headers=mutation, body=body, details=details))
