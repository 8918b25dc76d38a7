"""The upstream connection pool against a real simulator: keep-alive reuse, the connection limit,
abort on the client's behalf (the engine's running count drops), connect errors, streamed pieces."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import orjson
import pytest

from slogate.gateway.config import Timeouts
from slogate.gateway.upstream import Upstream
from slogate.gateway.upstream_conn import UpstreamError
from slogate.traces.http1 import request_bytes
from tests.gateway.fixtures_gateway import SIM_MODEL, sim_running, wait_for
from tests.servers import Server, free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def sim() -> Iterator[Server]:
    with start_sim(timing="constant", ttft_ms=5, itl_ms=30, seed=1) as server:  # gaps a busy box keeps apart
        yield server


def completion(up: Upstream, max_tokens: int, *, stream: bool = True) -> bytes:
    body = orjson.dumps({"model": SIM_MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": stream,
                         "ignore_eos": True})
    return request_bytes("POST", up.prefix + "/v1/completions", up.host_header,
                         [("Content-Type", "application/json")], body)


async def run_one(up: Upstream, max_tokens: int, stream: bool = True) -> tuple[int, list[tuple[bytes, int]]]:
    conn, head = await up.exchange(completion(up, max_tokens, stream=stream), no_body=False)
    pieces: list[tuple[bytes, int]] = []
    conn.stream_to(lambda piece, t: pieces.append((piece, t)))
    assert await conn.wait_body()
    up.pool.release(conn)  # type: ignore[union-attr]
    return head.status, pieces


async def test_pieces_arrive_timestamped_and_connection_is_reused(sim):
    up = Upstream(sim.url)
    await up.start(Timeouts(), 8)
    try:
        for stream in (True, False, True):
            status, pieces = await run_one(up, 4, stream)
            assert status == 200
            body = b"".join(p for p, _ in pieces)
            if stream:
                assert body.endswith(b"data: [DONE]\n\n") and body.count(b'"text"') == 4
                times = [t for _, t in pieces]
                assert times == sorted(times) and len(pieces) >= 4  # piece by piece, as they arrived
            else:
                assert orjson.loads(body)["usage"]["completion_tokens"] == 4
        assert up.pool.open == 1 and len(up.pool.idle) == 1  # type: ignore[union-attr]
    finally:
        await up.close()


async def test_limit_queues_and_head_only(sim):
    up = Upstream(sim.url)
    await up.start(Timeouts(), 2)
    try:
        results = await asyncio.gather(*(run_one(up, 3) for _ in range(6)))
        assert [s for s, _ in results] == [200] * 6
        assert up.pool.open <= 2  # type: ignore[union-attr]
        conn, head = await up.exchange(request_bytes("HEAD", "/v1/models", up.host_header, [], b""), no_body=True)
        assert head.status in (200, 405) and conn.complete
        up.pool.release(conn)  # type: ignore[union-attr]
        assert (await run_one(up, 2))[0] == 200  # the connection is still in sync after a HEAD
    finally:
        await up.close()


async def test_abort_mid_stream_stops_the_engine_request(sim):
    up = Upstream(sim.url)
    await up.start(Timeouts(), 8)
    try:
        conn, _ = await up.exchange(completion(up, 2000), no_body=False)
        got = asyncio.Event()
        conn.stream_to(lambda piece, t: got.set())
        await asyncio.wait_for(got.wait(), 5)
        assert await asyncio.to_thread(sim_running, sim.url) == 1
        conn.abort()
        up.pool.release(conn)  # type: ignore[union-attr]
        await asyncio.to_thread(wait_for, lambda: sim_running(sim.url) == 0)
        await asyncio.sleep(0.05)
        assert up.pool.open == 0 and not up.pool.idle  # type: ignore[union-attr]
    finally:
        await up.close()


async def test_flow_control_pause_and_resume(sim):
    up = Upstream(sim.url)
    await up.start(Timeouts(), 8)
    try:
        conn, _ = await up.exchange(completion(up, 30), no_body=False)
        pieces: list[bytes] = []

        def sink(piece: bytes, t: int) -> None:
            pieces.append(piece)
            conn.pause_reading()

        conn.stream_to(sink)
        rounds = 0
        while not await conn.wait_body():
            rounds += 1
            await asyncio.sleep(0.01)
            conn.resume_reading()
        assert rounds >= 1 and b"".join(pieces).endswith(b"data: [DONE]\n\n")
        up.pool.release(conn)  # type: ignore[union-attr]  # it ended paused: reuse must still read
        status, again = await asyncio.wait_for(run_one(up, 3), 5)
        assert status == 200 and b"".join(p for p, _ in again).endswith(b"data: [DONE]\n\n")
        assert up.pool.open == 1  # type: ignore[union-attr]
    finally:
        await up.close()


async def test_connect_refused_and_unstarted():
    up = Upstream(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamError) as err:
        await up.exchange(b"GET / HTTP/1.1\r\n\r\n", no_body=False)
    assert err.value.code == "upstream_connect"
    await up.start(Timeouts(), 8)
    with pytest.raises(UpstreamError) as err:
        await up.exchange(b"GET / HTTP/1.1\r\n\r\n", no_body=False)
    assert err.value.code == "upstream_connect" and up.pool.open == 0  # type: ignore[union-attr]
    await up.close()


class _OneShotServer(asyncio.Protocol):
    """Answers the first request on a connection, then hangs up on the next one unanswered (an upstream
    that closed an idle keep-alive connection just as the request crossed it); `/die` is never answered."""

    def connection_made(self, transport):  # type: ignore[no-untyped-def]
        self.transport, self.served, self.buf = transport, 0, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n\r\n" not in self.buf:
            return
        line, self.buf = self.buf.split(b"\r\n", 1)[0], b""
        if self.served or b"/die" in line:
            self.transport.close()
            return
        self.served += 1
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_stale_reused_connection_is_retried_once_and_a_fresh_failure_is_not():
    server = await asyncio.get_running_loop().create_server(_OneShotServer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = Upstream(f"http://127.0.0.1:{port}")
    await up.start(Timeouts(), 8)
    try:
        for _ in range(3):  # the 2nd and 3rd reuse a connection the server then drops: retried on a new one
            conn, head = await up.exchange(request_bytes("GET", "/", up.host_header, [], b""), no_body=False)
            conn.stream_to(lambda piece, t: None)
            assert head.status == 200 and await conn.wait_body()
            up.pool.release(conn)  # type: ignore[union-attr]
        with pytest.raises(UpstreamError) as err:
            await up.exchange(request_bytes("GET", "/die", up.host_header, [], b""), no_body=False)
        assert err.value.code == "reset"
    finally:
        await up.close()
        server.close()
        await server.wait_closed()


class _LateEndServer(asyncio.Protocol):
    """Streams `data: [DONE]` and sends the chunked terminator `delay` seconds later (or never)."""

    accepted = 0
    delay: float | None = 0.05

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).accepted += 1
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n\r\n" not in self.buf:
            return
        self.buf = b""
        done = b"data: [DONE]\n\n"
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"%x\r\n%b\r\n" % (len(done), done))
        if self.delay is not None:
            asyncio.get_running_loop().call_later(self.delay, self.transport.write, b"0\r\n\r\n")


async def poll(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _pieces_until_done(conn) -> list[bytes]:  # type: ignore[no-untyped-def]
    pieces: list[bytes] = []
    conn.stream_to(lambda piece, t: pieces.append(piece))
    await poll(lambda: bool(pieces))
    return pieces


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
@pytest.mark.parametrize("delay", [0.05, None])
async def test_a_stream_released_after_done_keeps_its_connection_when_the_body_ends(delay):
    """The relay ends the client's response at [DONE]; the pool reads the terminator that comes later
    and reuses the connection (a terminator that never comes: the connection is closed after FINISH_S)."""
    _LateEndServer.accepted, _LateEndServer.delay = 0, delay
    server = await asyncio.get_running_loop().create_server(_LateEndServer, "127.0.0.1", 0)
    up = Upstream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    await up.start(Timeouts(), 8)
    pool = up.pool
    assert pool is not None
    try:
        for _ in range(3):
            conn, _ = await up.exchange(request_bytes("GET", "/", up.host_header, [], b""), no_body=False)
            pieces = await _pieces_until_done(conn)
            assert pieces == [b"data: [DONE]\n\n"]
            assert not conn.complete  # the terminator is still to come
            pool.release(conn, finish_body=True)
            if delay is None:
                await poll(lambda: pool.open == 0, timeout=5)  # given up after FINISH_S: closed, slot back
            else:
                await poll(lambda: len(pool.idle) == 1)  # read to its end, then idle for reuse
        assert _LateEndServer.accepted == (1 if delay is not None else 3)
    finally:
        await up.close()
        server.close()
        await server.wait_closed()
