"""The load-path HTTP/1.1 client against a raw socket server: chunked bodies split anywhere,
Content-Length and close-delimited bodies, keep-alive reuse and a stale kept-alive connection."""

from __future__ import annotations

import asyncio

import pytest

from slogate.replay.http import HttpError, Pool

SSE = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for n in sizes:
        part = body[i:i + n]
        i += n
        if part:
            out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


async def serve(responses: list[bytes], *, split: int = 3, close_after: set[int] = frozenset()) -> tuple[asyncio.Server, list[int]]:
    """A server answering the n-th request on any connection with responses[n], written in tiny pieces."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            n = len(seen)
            seen.append(n)
            data = responses[n]
            for i in range(0, len(data), split):
                writer.write(data[i:i + split])
                await writer.drain()
                await asyncio.sleep(0)
            if n in close_after:
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


def run(coro):
    return asyncio.run(coro)


def test_chunked_content_length_and_close_delimited() -> None:
    async def go() -> None:
        body = chunked(SSE, [5, 1, 30, 100])
        responses = [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n" + body,
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\n{\"error\":1}",
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + SSE,
        ]
        server, seen = await serve(responses, close_after={2})
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"http://127.0.0.1:{port}", {"Authorization": "Bearer x"})
        got: list[bytes] = []
        assert await pool.post("/v1/completions", b"{}", lambda b, t: got.append(b), timeout_s=5) == 200
        assert b"".join(got) == SSE
        got.clear()
        assert await pool.post("/v1/completions", b"{}", lambda b, t: got.append(b), timeout_s=5) == 400
        assert b"".join(got) == b"{\"error\":1}"
        got.clear()
        assert await pool.post("/v1/completions", b"{}", lambda b, t: got.append(b), timeout_s=5) == 200
        assert b"".join(got) == SSE
        assert seen == [0, 1, 2]
        pool.close()
        server.close()

    run(go())


def test_stale_keepalive_connection_is_retried_once() -> None:
    async def go() -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        server, seen = await serve([ok, ok], close_after={0})  # server closes after the first answer
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"http://127.0.0.1:{port}", {})
        # the first response had no Connection: close, so the client keeps the (now dead) connection
        assert await pool.post("/x", b"{}", lambda b, t: None, timeout_s=5) == 200
        await asyncio.sleep(0.05)
        assert await pool.post("/x", b"{}", lambda b, t: None, timeout_s=5) == 200
        assert seen == [0, 1]
        server.close()

    run(go())


def test_connect_refused_and_timeout() -> None:
    async def go() -> None:
        from tests.servers import free_port

        pool = Pool(f"http://127.0.0.1:{free_port()}", {})
        with pytest.raises(HttpError) as e:
            await pool.post("/x", b"{}", lambda b, t: None, timeout_s=1)
        assert e.value.kind == "connect"
        server, _ = await serve([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"])
        pool = Pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {})
        with pytest.raises(HttpError) as e:
            await pool.post("/x", b"{}", lambda b, t: None, timeout_s=0.3)
        assert e.value.kind == "timeout"
        server.close()

    run(go())


def test_a_silent_reused_connection_times_out_once_and_is_not_retried() -> None:
    """The timeout fires on a kept-alive connection that got no byte: a timeout (not a stale
    connection to retry), the connection is closed, and the next request opens a new one."""
    async def go() -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        server, seen = await serve([ok, b"", ok])  # the second request gets no answer at all
        pool = Pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {})
        assert await pool.post("/x", b"{}", lambda b, t: None, timeout_s=5) == 200
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(HttpError) as e:
            await pool.post("/x", b"{}", lambda b, t: None, timeout_s=0.3)
        assert e.value.kind == "timeout" and loop.time() - t0 >= 0.29
        assert seen == [0, 1]  # not sent again
        assert await pool.post("/x", b"{}", lambda b, t: None, timeout_s=5) == 200
        assert seen == [0, 1, 2]
        server.close()

    run(go())


def test_hostile_framing_is_a_protocol_failure_in_the_record_and_never_raises_in_the_protocol() -> None:
    from slogate.replay.client import ClientConfig, complete, start
    from tests import hostile_upstream

    async def go() -> None:
        loop = asyncio.get_running_loop()
        raised: list[dict] = []
        loop.set_exception_handler(lambda _loop, ctx: raised.append(ctx))
        server, url = await hostile_upstream.serve()
        cfg = ClientConfig(base_url=url, stream=False, timeout_s=5)
        pool = Pool(url, {})
        try:
            for path in (b"/v1/cl-te", b"/v1/1xx", *hostile_upstream.PROTOCOL_ERRORS, b"/v1/ok"):
                got: list[bytes] = []
                p = pool.begin(path.decode() + "?id=r", b"{}", lambda b, t, got=got: got.append(b))
                if path in hostile_upstream.PROTOCOL_ERRORS:
                    with pytest.raises(HttpError) as e:
                        await pool.finish(p, timeout_s=5)
                    assert e.value.kind == "protocol", path
                    record = await complete(pool, cfg, start(pool, cfg, b"{}", intended_ns=0, endpoint=path.decode()))
                    assert (record.error, record.status) == ("protocol", 0), path
                else:
                    assert await pool.finish(p, timeout_s=5) == 200
                    assert b"".join(got) == hostile_upstream.body_for(b"r"), path
            assert raised == []  # nothing escaped from data_received
        finally:
            pool.close()
            server.close()

    run(go())
