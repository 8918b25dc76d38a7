"""One upstream inference server: its URL and its keep-alive connection pool.

Each `Upstream` owns one `Pool` of raw HTTP/1.1 connections (`gateway.upstream_conn`) for the life of
the process: a raised connection limit, idle connections reused most-recent-first and dropped after
`KEEPALIVE_S`. Never opens a connection per request when an idle one exists, never decompresses.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from time import monotonic

import yarl

from slogate.gateway.config import Timeouts
from slogate.gateway.upstream_conn import UpstreamConn, UpstreamError
from slogate.traces.http1 import Head

# Idle connections are reused for this long (nginx's upstream default). An upstream that closes idle
# connections sooner (uvicorn: 5 s) is seen closing (the connection leaves the pool); the race where
# its close crosses our request is covered by `Upstream.exchange` retrying once on a fresh connection.
KEEPALIVE_S = 60.0
FINISH_S = 2.0  # a stream past `[DONE]` whose body has not ended: how long the pool waits for its end


class Pool:
    """Keep-alive connections to one origin; at most `limit` open (0: unlimited), waiters queue FIFO."""

    def __init__(self, url: yarl.URL, *, limit: int, connect_timeout: float | None) -> None:
        self.host = url.raw_host or "127.0.0.1"
        self.port = url.port or 80
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.idle: list[UpstreamConn] = []
        self.open = 0
        self.closed = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> tuple[UpstreamConn, bool]:
        """A connection and whether it was reused; raises UpstreamError(upstream_connect|timeout_connect)."""
        idle = self.idle
        while True:
            while idle:
                conn = idle.pop()
                if (not conn.closed and monotonic() - conn.idle_since < KEEPALIVE_S
                        and not conn.transport.is_closing()):  # type: ignore[union-attr]
                    return conn, True
                conn.abort()
            if self.closed:
                raise UpstreamError("upstream_connect", "gateway is stopping")
            if not self.limit or self.open < self.limit:
                return await self._connect(), False
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._wake_one()  # woken but leaving: pass the turn on
                raise

    async def _connect(self) -> UpstreamConn:
        loop = asyncio.get_running_loop()
        self.open += 1  # counted from now: concurrent connects respect the limit
        made: list[UpstreamConn] = []

        def factory() -> UpstreamConn:
            conn = UpstreamConn(self.lost)
            conn.counted = True  # from here on `lost` gives the slot back
            made.append(conn)
            return conn

        try:
            coro = loop.create_connection(factory, self.host, self.port, ssl=self.ssl,
                                          server_hostname=self.host if self.ssl else None)
            _, conn = await (coro if self.connect_timeout is None else asyncio.wait_for(coro, self.connect_timeout))
        except BaseException as exc:
            if made:
                made[0].abort()
            if not made or made[0].counted:  # give the slot back exactly once
                if made:
                    made[0].counted = False
                self._freed()
            if isinstance(exc, TimeoutError):
                raise UpstreamError("timeout_connect", f"{self.host}:{self.port}") from None
            if isinstance(exc, OSError):
                raise UpstreamError("upstream_connect", f"{self.host}:{self.port}: {type(exc).__name__}") from None
            raise
        return conn

    def release(self, conn: UpstreamConn, *, finish_body: bool = False) -> None:
        """End of an exchange: keep a clean connection for reuse, close any other. `finish_body`: the
        relay needs no more of the body (a stream past `[DONE]`): read its end for up to FINISH_S, then decide."""
        if finish_body and not conn.complete and not conn.closed and not self.closed:
            timer = asyncio.get_running_loop().call_later(FINISH_S, conn.abort)

            def finished(c: UpstreamConn) -> None:
                timer.cancel()
                self.release(c)

            conn.finish_then(finished)
            return
        if conn.complete and conn.keep_alive and not conn.closed and not self.closed:
            conn.resume_reading()  # idle connections must see the upstream closing them
            conn.idle_since = monotonic()
            self.idle.append(conn)
            self._wake_one()
        elif conn.complete and not conn.closed:
            conn.closed = True
            conn.transport.close()  # type: ignore[union-attr]  # done, just not reusable: a clean FIN
        else:
            conn.abort()

    def lost(self, conn: UpstreamConn) -> None:
        """Called by a connection when its socket closed."""
        if conn.counted:
            conn.counted = False
            self._freed()

    def _freed(self) -> None:
        self.open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def close(self) -> None:
        self.closed = True
        for conn in self.idle:
            conn.abort()
        self.idle.clear()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)


class Upstream:
    """An upstream server (its live load is counted by the router, `routing.upstreams.UpstreamState`)."""

    __slots__ = ("_parsed", "base", "host_header", "name", "pool", "prefix", "url")

    def __init__(self, url: str, name: str | None = None) -> None:
        parsed = yarl.URL(url)
        self._parsed = parsed
        self.url = url.rstrip("/")
        self.base = self.url  # request raw path is appended to this
        self.prefix = parsed.raw_path.rstrip("/")  # path prefix of every upstream request
        self.host_header = parsed.host_port_subcomponent or "127.0.0.1"
        # Label used in metrics and traces: host:port only (never credentials or paths).
        self.name = name or f"{parsed.host}:{parsed.explicit_port or parsed.port}"
        self.pool: Pool | None = None

    async def start(self, timeouts: Timeouts, max_connections: int) -> None:
        connect = None if timeouts.connect == float("inf") else timeouts.connect
        self.pool = Pool(self._parsed, limit=max_connections, connect_timeout=connect)

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    @property
    def ready(self) -> bool:
        return self.pool is not None and not self.pool.closed

    async def exchange(self, data: bytes, *, no_body: bool, body: bytes | bytearray = b"") -> tuple[UpstreamConn, Head]:
        """Send one request and wait for the response head; a reused connection that the upstream had
        already closed (no byte came back) is replaced once by a fresh one. Raises UpstreamError."""
        pool = self.pool
        if pool is None:
            raise UpstreamError("upstream_connect", "gateway not started")
        for attempt in range(2):
            conn, reused = await pool.acquire()
            try:
                try:
                    conn.send(data, no_body=no_body, body=body)
                except (OSError, RuntimeError) as exc:  # the transport closed under us
                    conn.abort()
                    raise UpstreamError("reset", type(exc).__name__) from None
                return conn, await conn.read_head()
            except UpstreamError as exc:
                if reused and attempt == 0 and exc.code == "reset" and not conn.got_bytes:
                    continue
                raise
            except BaseException:
                conn.abort()
                raise
        raise AssertionError("unreachable")
