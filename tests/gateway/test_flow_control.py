"""Back-pressure through the gateway: a client that reads slowly still gets every byte of a long stream
(the relay pauses the upstream while the client's write buffer is full and resumes when it drains), and
a client that reads nothing and hangs up aborts the upstream request."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest

from tests.gateway.fixtures_gateway import SIM_MODEL, sim_running, start_gateway, wait_for
from tests.servers import Server
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)


LONG_MODEL = "qwen2.5-7b"  # 32k context: a stream of several MB, more than the kernel socket buffers hold


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[Server, Server]]:
    with (
        start_sim(timing="constant", ttft_ms=1, itl_ms=0.01, seed=3, model=LONG_MODEL) as sim,
        start_gateway(sim.url, "--idle-timeout", "20s") as gw,
    ):
        yield sim, gw


def send(gw: Server, max_tokens: int, model: str = SIM_MODEL) -> socket.socket:
    body = orjson.dumps({"model": model, "prompt": "hi", "max_tokens": max_tokens, "stream": True,
                         "ignore_eos": True})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_slow_reader_gets_the_whole_stream(setup):
    _, gw = setup
    sock = send(gw, 30000, LONG_MODEL)
    time.sleep(3)  # a client that does not read: the gateway's write buffer to it fills up and it pauses
    data = bytearray()
    sock.settimeout(30)
    while part := sock.recv(1 << 16):
        data += part
    sock.close()
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body.count(b'"text"') == 30000 and b"data: [DONE]" in body and body.endswith(b"0\r\n\r\n")


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_stalled_reader_that_hangs_up_aborts_upstream():
    with (
        start_sim(timing="constant", ttft_ms=1, itl_ms=1, seed=3) as sim,
        start_gateway(sim.url, "--idle-timeout", "20s") as gw,
    ):
        sock = send(gw, 8000)
        assert wait_for(lambda: sim_running(sim.url) == 1)
        time.sleep(1.5)  # the client reads nothing: its buffers fill and the gateway pauses the upstream
        assert sim_running(sim.url) == 1
        sock.close()
        assert wait_for(lambda: sim_running(sim.url) == 0, timeout=5), "upstream request kept running"
