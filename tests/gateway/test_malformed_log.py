"""Malformed client requests are logged at most once per 10 s with their count; the ones counted after the
last line are said at shutdown (three in one second gave one line of 1 and the other two never)."""

from __future__ import annotations

import re
import socket

from tests.gateway.fixtures_gateway import start_gateway
from tests.simserver import start_sim


def _malformed(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(head)
        return s.recv(4096)


def test_every_malformed_request_is_in_the_log_by_shutdown() -> None:
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, start_gateway(sim.url) as gw:
        for head in (b"BR@KEN / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"):
            assert _malformed(gw.url, head).split(b" ", 2)[1] in (b"400", b"431")
        assert gw.stop() == 0
        counts = [int(n) for n in re.findall(r"malformed client requests answered 400: (\d+) since", gw.log_text())]
    assert sum(counts) == 3, gw.log_text()[-2000:]
