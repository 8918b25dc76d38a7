"""HTTP/1.1 framing of the upstream client: chunked bodies split at every byte, response heads, request bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate.gateway.h1 import ChunkedDecoder, ProtocolError, parse_head, request_bytes

EVENTS = [b'data: {"choices":[{"text":"a"}]}\n\n', b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]


def chunked(pieces: list[bytes], *, ext: bool = False, trailer: bytes = b"") -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";a=b" if ext else b"", p) for p in pieces)
    return out + b"0\r\n" + trailer + b"\r\n"


def decode(wire: bytes, cuts: list[int]) -> tuple[bytes, ChunkedDecoder]:
    dec = ChunkedDecoder()
    out, last = [], 0
    for cut in [*sorted(cuts), len(wire)]:
        out.append(dec.feed(wire[last:cut]))
        last = cut
    return b"".join(out), dec


@pytest.mark.parametrize("ext", [False, True])
@pytest.mark.parametrize("trailer", [b"", b"X-Trailer: 1\r\n"])
def test_chunked_split_at_every_byte(ext, trailer):
    wire = chunked(EVENTS, ext=ext, trailer=trailer)
    body = b"".join(EVENTS)
    for cut in range(len(wire) + 1):
        got, dec = decode(wire, [cut])
        assert got == body and dec.done and dec.extra == b"", cut


def test_chunked_byte_by_byte_and_whole():
    wire = chunked(EVENTS)
    assert decode(wire, list(range(len(wire))))[0] == b"".join(EVENTS)
    dec = ChunkedDecoder()
    assert dec.feed(wire) == b"".join(EVENTS) and dec.done


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=70), max_size=6), st.lists(st.integers(0, 600), max_size=8))
def test_chunked_any_pieces_any_cuts(pieces, cuts):
    wire = chunked(pieces)
    got, dec = decode(wire, [c for c in cuts if c <= len(wire)])
    assert got == b"".join(pieces) and dec.done


def test_chunked_single_whole_chunk_is_one_slice_and_extra_is_kept():
    dec = ChunkedDecoder()
    assert dec.feed(b"5\r\nhello\r\n") == b"hello" and not dec.done
    assert dec.feed(b"0\r\n\r\nHTTP/1.1") == b"" and dec.done and dec.extra == b"HTTP/1.1"


@pytest.mark.parametrize("wire", [b"zz\r\nab\r\n", b"-1\r\nab\r\n", b"2\r\nabXY"])
def test_chunked_bad_framing_raises(wire):
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(wire)


def test_parse_head():
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-A: 1\r\nx-a: 2\r\n"
                      b"Transfer-Encoding: chunked")
    assert (head.status, head.reason, head.chunked, head.length, head.keep_alive) == (200, "OK", True, None, True)
    assert head.headers.getall("X-A") == ["1", "2"] and head.headers["content-type"] == "text/event-stream"
    head = parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\nConnection: close")
    assert (head.status, head.length, head.keep_alive) == (404, 12, False)
    head = parse_head(b"HTTP/1.0 200 OK")
    assert head.length is None and not head.chunked and not head.keep_alive
    for bad in (b"HTTP/1.1 2x0 OK", b"SPAM", b"HTTP/1.1 200 OK\r\nno colon", b"HTTP/1.1 200 OK\r\nContent-Length: x",
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2", b"HTTP/1.1 200 OK\r\n Folded: x"):
        with pytest.raises(ProtocolError):
            parse_head(bad)


def test_request_bytes():
    data = request_bytes("POST", "/v1/x?a=1", "h:8000", [("Authorization", "Bearer k")], b"{}")
    assert data == b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h:8000\r\nAuthorization: Bearer k\r\nContent-Length: 2\r\n\r\n{}"
    assert b"Content-Length" not in request_bytes("GET", "/", "h", [], b"")
    assert b"Content-Length: 0" in request_bytes("POST", "/", "h", [], b"")
