"""Request trailers stay with their request: hypothesis pipelines chunked requests with trailers
(credentials, framing and control headers among them) through a real `slogate gateway` to
tests/hostile_upstream.py's `echo` case, which answers with the request head it received. No
trailer field may show up in any request the upstream got; the gateway may drop trailers or refuse
them with a 400, nothing else."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httptools
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests import hostile_upstream
from tests.realservers import start_gateway
from tests.servers import Server

pytestmark = pytest.mark.timeout(300)
TRAILER_NAMES = [b"Authorization", b"X-Trailer-Canary", b"Host", b"Content-Length", b"Transfer-Encoding",
                 b"x-slogate-priority", b"Cookie", b"api-key", b"Content-Type"]
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})


@pytest.fixture(scope="module")
def gw() -> Iterator[Server]:
    with hostile_upstream.in_thread() as url, start_gateway(url, extra_args=("--client-keepalive-timeout", "2")) as server:
        yield server


@st.composite
def pipelines(draw: st.DrawFn) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
    """2–3 requests as (wire, trailer fields); each trailer value is a marker unique to its request."""
    out = []
    for i in range(draw(st.integers(2, 3))):
        trailers = [(name, b"trailer%d-%d" % (i, j)) for j, name in
                    enumerate(draw(st.lists(st.sampled_from(TRAILER_NAMES), max_size=3)))]
        head = b"POST /v1/chat/completions?case=echo&id=%d HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" % i
        if trailers or draw(st.booleans()):
            size = draw(st.integers(1, len(BODY)))
            chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n" % (size, BODY[:size], len(BODY) - size, BODY[size:]) \
                if size < len(BODY) else b"%x\r\n%s\r\n" % (size, BODY)
            wire = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n" + \
                b"".join(b"%s: %s\r\n" % t for t in trailers) + b"\r\n"
        else:
            wire = head + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        out.append((wire, trailers))
    return out


def exchange(port: int, wire: bytes, n: int) -> list[tuple[int, bytes]]:
    """Send the pipeline; (status, body) of each response until `n` came or the gateway closed."""
    answers: list[tuple[int, bytes]] = []

    class Collect:
        def __init__(self) -> None:
            self.body = b""

        def on_message_begin(self) -> None:
            self.body = b""

        def on_body(self, data: bytes) -> None:
            self.body += data

        def on_message_complete(self) -> None:
            answers.append((parser.get_status_code(), self.body))

    parser = httptools.HttpResponseParser(Collect())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(wire)
        with contextlib.suppress(ConnectionResetError):
            while len(answers) < n and (data := s.recv(65536)):
                parser.feed_data(data)
    return answers


@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.generate],  # no shrinking: a fail is quick
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pipeline=pipelines())
def test_trailers_never_reach_another_request(gw: Server, pipeline: list) -> None:
    answers = exchange(gw.port, b"".join(wire for wire, _ in pipeline), len(pipeline))
    assert answers, "no answer at all"
    for k, (status, body) in enumerate(answers):
        if status == 400:  # the gateway refused trailers: the connection ends there
            assert k == len(answers) - 1
            continue
        assert status == 200 and body.startswith(b"POST /v1/chat/completions?case=echo&id=%d " % k), body[:200]
        seen = body.lower()
        for i, (_, trailers) in enumerate(pipeline):
            for name, value in trailers:
                assert value not in seen, f"trailer {name.decode()} of request {i} reached request {k} upstream"
