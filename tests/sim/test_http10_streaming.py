"""Streams to HTTP/1.0 clients: no chunked encoding there, so the SSE body ends when the server closes
the connection (as uvicorn answers them). The sim used to fail these with a 500 (aiohttp refuses to
enable chunked encoding for HTTP/1.0)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import orjson
import pytest

from tests.servers import Server
from tests.sim.conftest import parse_sse
from tests.simserver import start_sim

MODEL = "llama-3-8b"


@pytest.fixture(scope="module")
def sim() -> Iterator[Server]:
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as s:
        yield s


def exchange(port: int, head: bytes, body: bytes) -> bytes:
    """Send one request, read until the server closes the connection (a read timeout fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("connection", [b"", b"Connection: keep-alive\r\n"])
@pytest.mark.parametrize("path", [b"/v1/completions", b"/v1/chat/completions"])
def test_http10_stream_is_unframed_and_ends_with_the_connection(sim, connection, path):
    fields = {"prompt": "abcd"} if path == b"/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    body = orjson.dumps({"model": MODEL, "max_tokens": 4, "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True}, **fields})
    raw = exchange(sim.port, b"POST " + path + b" HTTP/1.0\r\nContent-Type: application/json\r\n" + connection, body)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), raw[:300]
    assert b"transfer-encoding" not in head.lower()
    assert b"text/event-stream" in head
    events = parse_sse(payload)  # bare SSE: no chunk-size lines between the events
    assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n")
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 4
    texts = [e for e in events[:-2] if e["choices"][0].get("text", e["choices"][0].get("delta", {}).get("content"))]
    assert len(texts) == 4


def test_http10_stream_error_event_is_unframed(sim):
    body = orjson.dumps({"model": MODEL, "prompt": "abcd", "max_tokens": 5, "ignore_eos": True, "stream": True})
    raw = exchange(sim.port, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                             b"x-slogate-fault: error_after=2\r\n", body)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), raw[:300]
    events = parse_sse(payload)
    assert [e == "[DONE]" or "error" in e for e in events] == [False, False, True, True]
    assert payload.endswith(b"data: [DONE]\n\n")
