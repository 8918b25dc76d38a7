"""A lean HTTP/1.1 client for the load path: keep-alive connections over the shared codec (`traces.http1`).

Each response byte piece is timestamped in `data_received` and handed straight to the traces
StreamObserver (no stream-reader layers in between): 3–4× less CPU per streamed token than a
general-purpose client, which is what lets one sender hold its schedule at high rates. Content-Length,
chunked and read-until-close bodies, TLS. Never parses bytes itself, never logs or keeps request headers.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from collections.abc import Callable, Sequence

from slogate.traces.http1 import ProtocolError, ResponseParser, request_bytes

Feed = Callable[[bytes, int], object]


class HttpError(Exception):
    """A failed exchange; `kind` is the record's error class: connect, reset, timeout, or protocol (the
    server's bytes were not valid HTTP/1.1)."""

    def __init__(self, kind: str, message: str = ""):
        super().__init__(message or kind)
        self.kind = kind


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.done: asyncio.Future[int] | None = None
        self.feed: Feed | None = None
        self.got_bytes = False
        self._parser: ResponseParser | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done, parser = self.done, self._parser
        if done is not None and not done.done():
            if parser is not None and parser.eof():  # a body delimited by the close
                done.set_result(parser.head.status)  # type: ignore[union-attr]
            else:
                done.set_exception(HttpError("reset", str(exc or "connection closed by the server")))

    def request(self, data: bytes, feed: Feed) -> asyncio.Future[int]:
        self._parser = ResponseParser()
        self.feed = feed
        self.got_bytes = False
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.done

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        self.got_bytes = True
        parser, done = self._parser, self.done
        if parser is None or done is None or done.done():  # bytes outside an exchange: out of step
            self._close()
            return
        try:
            body = parser.feed(data)
        except ProtocolError as exc:
            done.set_exception(HttpError("protocol", str(exc)))
            self._close()
            return
        if body and self.feed is not None:
            self.feed(body, t)
        if parser.done and not done.done():
            done.set_result(parser.head.status)  # type: ignore[union-attr]
            if not parser.keep_alive:
                self._close()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(conn: _Conn, fut: asyncio.Future[int]) -> None:
    if not fut.done():
        fut.set_exception(HttpError("timeout"))
        conn._close()


class Pending:
    """A request written (or to be written) on a connection, awaiting its response."""

    __slots__ = ("conn", "data", "feed", "fut", "retry_after")

    def __init__(self, data: bytes, feed: Feed, conn: _Conn | None, fut: asyncio.Future[int] | None):
        self.data, self.feed, self.conn, self.fut = data, feed, conn, fut
        self.retry_after: str | None = None  # the response's Retry-After header (429/503), if any


class Pool:
    """Keep-alive connections to one origin (per event loop); unlimited concurrency."""

    def __init__(self, base_url: str, headers: dict[str, str]):
        u = urllib.parse.urlsplit(base_url)
        self.host = u.hostname or "127.0.0.1"
        self.tls = u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self._ssl = ssl.create_default_context() if self.tls else None
        host = next((v for k, v in headers.items() if k.lower() == "host"), None)  # --header Host:… wins
        self._host = host or (self.host if self.port in (80, 443) else f"{self.host}:{self.port}")
        self._headers = [("Content-Type", "application/json"),
                         *((k, v) for k, v in headers.items() if k.lower() not in ("host", "content-length"))]
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self._ssl,
                                                   server_hostname=self.host if self.tls else None)
        except OSError as exc:
            raise HttpError("connect", str(exc)) from None
        return conn

    def _data(self, path: str, body: bytes, extra: Sequence[tuple[str, str]] = ()) -> bytes:
        headers = [*self._headers, *extra] if extra else self._headers
        return request_bytes("POST", self.prefix + path, self._host, headers, body)

    def begin(self, path: str, body: bytes, feed: Feed, extra: Sequence[tuple[str, str]] = ()) -> Pending:
        """Write the request now on an idle connection when there is one (synchronous: the send
        happens at the caller's instant); otherwise the connection is opened in `finish`. `extra`:
        headers of this request only (a session's id)."""
        data = self._data(path, body, extra)
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return Pending(data, feed, conn, conn.request(data, feed))
        return Pending(data, feed, None, None)

    async def finish(self, p: Pending, *, timeout_s: float) -> int:
        """Wait for the response of `begin`; returns the status code (HttpError on failure)."""
        deadline = time.perf_counter() + timeout_s
        for attempt in range(2):
            reused = p.conn is not None
            if p.conn is None:
                p.conn = await self._connect()
                p.fut = p.conn.request(p.data, p.feed)
            conn, fut = p.conn, p.fut
            assert fut is not None
            # One timer handle per request (not `asyncio.wait_for`'s wrapper task machinery): at the
            # deadline it fails the exchange with a timeout and closes the connection.
            timer = asyncio.get_running_loop().call_later(max(deadline - time.perf_counter(), 0.001),
                                                          _expire, conn, fut)
            try:
                status = await fut
            except asyncio.CancelledError:  # an interrupted run: the server sees the client go
                if conn.transport is not None:
                    conn.transport.close()
                raise
            except HttpError as exc:
                if exc.kind != "timeout" and reused and not conn.got_bytes and attempt == 0:
                    p.conn = p.fut = None  # a stale keep-alive connection: once more on a fresh one
                    continue
                raise
            finally:
                timer.cancel()
            if status in (429, 503) and conn._parser is not None and conn._parser.head is not None:
                p.retry_after = conn._parser.head.headers.get("Retry-After")
            if not conn.closed:
                self._idle.append(conn)
            return status
        raise HttpError("reset", "connection closed before the response")

    async def post(self, path: str, body: bytes, feed: Feed, *, timeout_s: float) -> int:
        """POST and stream the response body into `feed(piece, t_ns)`; returns the status code."""
        return await self.finish(self.begin(path, body, feed), timeout_s=timeout_s)

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
