"""One keep-alive HTTP/1.1 connection to an upstream, as a raw asyncio Protocol (the relay's client side).

Each body piece is decoded by the shared codec (`traces.http1`) in `data_received` and handed, with
its arrival time, straight to the relay's sink: no stream reader, no task or future per piece. The
sink may pause reading (client write buffer full); the relay awaits only for the head, a pause and
the end. Never parses bytes itself, never buffers a body it was not asked to, never retries, never logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from time import perf_counter_ns

from slogate.traces.http1 import Head, ProtocolError, ResponseParser

Sink = Callable[[bytes, int], None]

_HEAD, _BODY, _DONE, _FAILED = range(4)


class UpstreamError(Exception):
    """The exchange failed; `code` is the gateway error class (gateway.errors.ERRORS): `upstream_connect`,
    `timeout_connect` (from the pool), `reset` (the connection closed or broke), `upstream_error` (the
    upstream's bytes were not valid HTTP/1.1: error class "protocol")."""

    def __init__(self, code: str, detail: str | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


def _discard(piece: bytes, t: int) -> None:
    return None


class UpstreamConn(asyncio.Protocol):
    """A connection of a `Pool`; one exchange at a time."""

    __slots__ = (
        "_error", "_on_done", "_on_lost", "_parser", "_paused", "_pending", "_phase", "_sink", "_waiter",
        "closed", "counted", "got_bytes", "head", "idle_since", "keep_alive", "transport",
    )

    def __init__(self, on_lost: Callable[[UpstreamConn], None]) -> None:
        self._on_lost = on_lost  # the pool's bookkeeping when the socket closes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.counted = False  # holds one of the pool's `open` slots until the socket closes
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._phase = _DONE
        self._error: BaseException | None = None
        self._paused = False
        self._on_done: Callable[[UpstreamConn], None] | None = None

    # ------------------------------------------------------------------ relay side
    def send(self, data: bytes, *, no_body: bool, body: bytes | bytearray = b"") -> None:
        """Write one request (`body`: a large body written after `data`, its head); `no_body` for HEAD
        (the response head then ends the exchange)."""
        self.head: Head | None = None
        self._parser = ResponseParser(no_body=no_body)
        self._sink: Sink | None = None
        self._on_done = None
        self._pending: list[tuple[bytes, int]] | None = None
        self.resume_reading()  # a body that ended while its sink had paused reading leaves it paused
        self._error = None
        self.got_bytes = False
        self.keep_alive = True
        self._phase = _HEAD
        assert self.transport is not None
        self.transport.write(data)
        if body:
            self.transport.write(body)

    async def read_head(self) -> Head:
        while self._phase == _HEAD:
            await self._wait()
        if self._error is not None:
            raise self._error
        assert self.head is not None
        return self.head

    def stream_to(self, sink: Sink) -> None:
        """From now on body pieces go to `sink(piece, t_ns)` (pieces that came with the head first)."""
        self._sink = sink
        pending, self._pending = self._pending, None
        if pending:
            for piece, t in pending:
                self._deliver(piece, t)

    async def wait_body(self) -> bool:
        """Until the body ended (True) or the sink paused reading (False); raises UpstreamError on failure."""
        while True:
            if self._error is not None:
                raise self._error
            if self._phase == _DONE:
                return True
            if self._paused:
                return False
            await self._wait()

    def pause_reading(self) -> None:
        if not self._paused:
            self._paused = True
            if self.transport is not None and not self.closed:
                self.transport.pause_reading()
            self._wake()

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def finish_then(self, on_done: Callable[[UpstreamConn], None]) -> None:
        """The relay is done with this response before its body ended (the stream's `[DONE]` went by):
        read and discard the rest, then `on_done(self)` (the pool takes it back). A failure aborts it."""
        self._sink = _discard
        self._pending = None
        self._on_done = on_done
        self.resume_reading()

    @property
    def body_done(self) -> bool:
        """The body ended with the piece being delivered (checked by the sink)."""
        return self._parser.done

    @property
    def complete(self) -> bool:
        return self._phase == _DONE and self._error is None

    def abort(self) -> None:
        """Close now (the upstream sees the disconnect and stops generating)."""
        self._phase = _FAILED if self._phase != _DONE else _DONE
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    async def _wait(self) -> None:
        fut = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await fut
        finally:
            self._waiter = None

    def _wake(self) -> None:
        fut = self._waiter
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _fail(self, code: str, detail: str | None) -> None:
        if self._phase in (_HEAD, _BODY):
            self._error = UpstreamError(code, detail)
            self._phase = _FAILED
            self.abort()
            self._wake()

    # ------------------------------------------------------------------ protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_lost(self)
        if self._phase == _BODY and self._parser.eof():
            self._phase = _DONE  # a body delimited by the end of the connection
            self.keep_alive = False
            self._wake()
        else:
            self._fail("reset", "connection closed by the upstream" if exc is None else type(exc).__name__)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost ends or fails the exchange

    def data_received(self, data: bytes) -> None:
        t = perf_counter_ns()
        self.got_bytes = True
        phase = self._phase
        if phase != _BODY and phase != _HEAD:  # bytes outside an exchange: the connection cannot be trusted
            self.keep_alive = False
            self.abort()
            return
        parser = self._parser
        try:
            piece = parser.feed(data)
        except ProtocolError as exc:
            self._fail("upstream_error", str(exc))
            return
        if phase == _HEAD:
            if parser.head is None:
                return
            self.head = parser.head
            self.keep_alive = parser.keep_alive
            self._phase = _BODY
            self._wake()
        if piece:
            self._deliver(piece, t)
        if parser.done and self._phase == _BODY:
            self.keep_alive = parser.keep_alive
            self._phase = _DONE
            self._wake()
            on_done = self._on_done
            if on_done is not None:
                self._on_done = None
                on_done(self)

    def _deliver(self, piece: bytes, t: int) -> None:
        sink = self._sink
        if sink is None:
            if self._pending is None:
                self._pending = []
            self._pending.append((piece, t))
            return
        try:
            sink(piece, t)
        except BaseException as exc:  # a bug in the sink: end the exchange, re-raise in the relay task
            self._error = exc
            self._phase = _FAILED
            self.abort()
            self._wake()

