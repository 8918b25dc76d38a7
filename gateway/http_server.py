"""Serve: the gateway's HTTP/1.1 server on a raw asyncio Protocol (the proxy port and the admin port).

Requests are parsed by llhttp (httptools: strict, the parser Node.js and aiohttp use), buffered up to
the body limit and handed to the handler one at a time per connection (pipelined requests wait their
turn, reading pauses). Responses are written straight to the transport: the head with the first body
piece, chunk framing in one buffer per piece. Client-side deadlines and the connection cap are
bookkept here for gateway.client_limits. Never reads a request beyond its framing, never logs per
request, never logs header values (they may hold API keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from email.utils import formatdate
from time import perf_counter_ns
from typing import TYPE_CHECKING, ClassVar

import httptools

from slogate.gateway.client_limits import BUSY, REJECT, ClientLimits
from slogate.gateway.headers import RequestFields

if TYPE_CHECKING:
    from slogate.gateway.body_budget import BodyBudget

log = logging.getLogger("slogate.gateway")

Handler = Callable[["ClientRequest"], Awaitable[None]]

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 413: b"Payload Too Large",
            429: b"Too Many Requests", 431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
            501: b"Not Implemented", 502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}
MAX_HEAD_BYTES = 1 << 16  # request line + headers; larger gets 431
BIG_BODY = 1 << 20  # a body this large (by Content-Length) is read into one preallocated buffer: held once


def _refusal(status: str, message: str, code: int) -> bytes:
    """A fixed answer to a request that cannot be parsed (the connection closes after it)."""
    body = b'{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":%d}}\n' % (
        message.encode(), code)
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status.encode(), len(body), body))


_BAD_REQUEST = _refusal("400 Bad Request", "malformed HTTP/1.1 request", 400)
_HEAD_TOO_LARGE = _refusal("431 Request Header Fields Too Large", "request head larger than 64 KiB", 431)


class _MalformedLog:
    """One warning line per `interval` with the count of malformed requests since the last one."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval, self.next_t, self.count = interval, 0.0, 0
        self.last = ""  # the kind of the latest one

    def note(self, exc: Exception) -> None:
        self.count += 1
        self.last = type(exc).__name__
        now = time.monotonic()
        if now >= self.next_t:
            self.next_t = now + self.interval
            self.flush()

    def flush(self) -> None:
        """The line for the requests counted since the last one (also at shutdown, else never said)."""
        if self.count:
            n, self.count = self.count, 0
            log.warning("malformed client requests answered 400: %d since the last such line (%s); "
                        "at most one line per %gs", n, self.last, self.interval)


def log_pending_malformed() -> None:
    _MALFORMED.flush()


_MALFORMED = _MalformedLog()


class _Date:
    """The `Date` header of the gateway's own responses, formatted once per second."""

    second: ClassVar[int] = -1
    value: ClassVar[str] = ""

    @classmethod
    def now(cls) -> str:
        s = int(time.time())
        if s != cls.second:
            cls.second, cls.value = s, formatdate(s, usegmt=True)
        return cls.value


def reply_bytes(status: int, body: bytes, *, content_type: str = "application/json",
                headers: Iterable[tuple[str, str]] = (), close: bool = False, head_only: bool = False) -> bytes:
    """A whole response with Content-Length (the gateway's own answers: errors, admin endpoints)."""
    head = _head(status, b"", encode_fields([("Content-Type", content_type), ("Content-Length", str(len(body))),
                                             ("Date", _Date.now()), *headers]), close)
    return head + b"\r\n" if head_only else head + b"\r\n" + body


class Reply:
    """A whole response the gateway answers itself (an error, an admin endpoint). A plain class, not a
    msgspec.Struct: this module may be compiled (gateway/native.py), and mypyc keeps no generic annotations."""

    __slots__ = ("body", "close", "content_type", "headers", "status")

    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: tuple[tuple[str, str], ...] = (), close: bool = False) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.close = close  # close the connection after it (e.g. a request body left unread)


class ClientRequest:
    """One parsed request (head and whole body) and the connection to answer on."""

    __slots__ = ("body", "conn", "headers", "held", "keep_alive", "method", "path", "raw_path", "refused", "t0",
                 "t_body", "too_large", "version")

    def __init__(self, conn: ClientConn, method: str, raw_path: str, headers: RequestFields, version: str,
                 t0: int) -> None:
        self.conn = conn
        self.method = method
        self.raw_path = raw_path  # the request target as sent (path and query)
        q = raw_path.find("?")
        self.path = raw_path if q < 0 else raw_path[:q]
        self.headers = headers
        self.version = version  # "1.1" or "1.0"
        self.t0 = t0  # perf_counter_ns when the head was complete
        self.t_body = t0
        self.body: bytes | bytearray = b""  # a bytearray when preallocated (a large body: http_server.BIG_BODY)
        self.keep_alive = True
        self.too_large: int | None = None  # the body exceeded the limit: its announced length, or -1
        self.refused = False  # the body did not fit the in-flight body budget (answered 503, never read)
        self.held = 0  # body bytes taken from the connection's BodyBudget (given back by release_body)

    def release_body(self) -> None:
        """The body is no longer needed (the upstream has it, or the request ended): drop it and give
        its bytes back to the budget."""
        self.body = b""
        if self.held:
            self.conn.budget.give(self.held)  # type: ignore[union-attr]
            self.held = 0

    @property
    def content_length(self) -> int | None:
        v = self.headers.get("Content-Length")
        return int(v) if v is not None and v.isdigit() else None

    @property
    def remote(self) -> str | None:
        return self.conn.remote


class Port:
    """One listening port's settings, and its protocol factory: calling it makes the connection."""

    def __init__(self, handler: Handler, *, max_body: int, limits: ClientLimits | None,
                 budget: BodyBudget | None = None) -> None:
        self.handler = handler
        self.max_body = max_body
        self.limits = limits  # the proxy port's client limits
        self.budget = budget  # the proxy port's in-flight body budget (gateway.body_budget)
        self.registry: set[ClientConn] = set()  # the port's open connections (shutdown drains them)

    def __call__(self) -> ClientConn:
        return ClientConn(self)


class ClientConn(asyncio.Protocol):
    """One client connection: parse, dispatch one request at a time, write the response."""

    def __init__(self, port: Port) -> None:
        self.handler: Handler = port.handler
        self.max_body = port.max_body
        self.limits = port.limits
        self.budget = port.budget
        self.registry = port.registry
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set in connection_made
        self.remote: str | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[ClientRequest] = deque()  # complete requests waiting for the current one
        self._req: ClientRequest | None = None  # the request being parsed
        self._parsing = True  # False once the connection reads no more requests (body too large, bad bytes)
        self._url: list[bytes] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_len = 0
        self._big: bytearray | None = None  # the preallocated buffer of a BIG_BODY request
        self._task: asyncio.Task | None = None  # the handler of the request being answered
        self.current: ClientRequest | None = None
        self.closing = False
        self.writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._read_paused = False
        # the response under way
        self._pending_head: bytes | None = None
        self.chunked = False
        self.started = False  # a response head went (or is about to go) out
        self.ended = True
        self._close_after = False
        # client-limits bookkeeping (gateway.client_limits.ClientLimits.sweep reads these)
        self.bytes_in = self.bytes_at_req = 0
        self.hdr_t: float | None = None  # first byte of an incomplete head; BUSY while a handler runs
        self.idle_t = self.req_t = 0.0
        self.in_body = False

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.registry.add(self)
        self._loop = loop = asyncio.get_running_loop()  # once: each call is a getpid() syscall in 3.11
        self.idle_t = self.req_t = loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = transport.get_extra_info("peername")
            self.remote = peer[0] if peer else None
        limits = self.limits
        if limits is not None and not limits.admit(self):
            self.closing = True
            transport.write(REJECT)  # type: ignore[attr-defined]
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.registry.discard(self)
        if self.limits is not None:
            self.limits.conns.pop(self, None)
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # the client left: the relay records it and aborts the upstream
        for req in (self._req, *self._queue):  # bodies never handed to the handler
            if req is not None:
                req.release_body()
        self._queue.clear()
        self._big = None
        fut = self._drain
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionResetError("client disconnected"))

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        fut = self._drain
        if fut is not None and not fut.done():
            fut.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.closing or not self._parsing:
            return
        self.bytes_in += len(data)
        if self.hdr_t is None:
            self.hdr_t = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(_BAD_REQUEST)  # Upgrade/CONNECT: not proxied
        except httptools.HttpParserError as exc:
            if self.limits is not None:
                self.limits.malformed += 1
            _MALFORMED.note(exc)
            self._refuse(_HEAD_TOO_LARGE if self._head_bytes > MAX_HEAD_BYTES else _BAD_REQUEST)

    # ------------------------------------------------------------------ llhttp callbacks
    def on_message_begin(self) -> None:
        self._url.clear()
        self._headers = []
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._grow(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._headers
        if headers and not name and not value:
            return
        headers.append((name, value))
        self._grow(len(name) + len(value) + 4)

    def _grow(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("head too large")

    def on_headers_complete(self) -> None:
        if not self._parsing:
            return  # a request pipelined behind one that ended the connection: never answered
        t0 = perf_counter_ns()
        parser = self._parser
        try:
            target = b"".join(self._url).decode("ascii")
        except UnicodeDecodeError:
            raise httptools.HttpParserError("non-ASCII request target") from None
        headers = RequestFields([(k.lower(), k, v) for k, v in self._headers])
        req = ClientRequest(self, parser.get_method().decode("ascii"), target, headers,
                            parser.get_http_version(), t0)
        req.keep_alive = parser.should_keep_alive()
        self._req = req
        self._body = []
        self._body_len = 0
        self.in_body = True
        self.req_t, self.bytes_at_req = self._loop.time(), self.bytes_in
        length = req.content_length
        if length is not None and length > self.max_body:
            req.too_large = length  # answered at once; the unread body closes the connection
            if self.budget is not None:
                self.budget.too_large()
            self._stop_reading_for(req)
            return
        if length and self.budget is not None:
            if not self.budget.take(length):
                req.refused = True  # answered 503 at once; the unread body closes the connection
                self._stop_reading_for(req)
                return
            req.held = length
            if length >= BIG_BODY:
                self._big = bytearray(length)
        expect = headers.get("Expect")
        if expect is not None and expect.lower() == "100-continue" and req.version == "1.1" \
                and self.current is None and not self._queue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        req = self._req
        if req is None:
            return
        n = len(body)
        self._body_len += n
        if self._body_len > self.max_body:
            req.too_large = -1
            if self.budget is not None:
                self.budget.too_large()
            self._stop_reading_for(req)
            return
        big = self._big
        if big is not None:
            big[self._body_len - n:self._body_len] = body
            return
        if self._body_len > req.held and self.budget is not None:  # chunked: taken as it arrives
            if not self.budget.take(self._body_len - req.held):
                req.refused = True
                self._stop_reading_for(req)
                return
            req.held = self._body_len
        self._body.append(body)

    def on_message_complete(self) -> None:
        req = self._req
        if req is None:
            return
        self._req = None
        self.in_body = False
        body = self._body
        if self._big is not None:
            req.body, self._big = self._big, None
        else:
            req.body = body[0] if len(body) == 1 else b"".join(body)
        req.t_body = perf_counter_ns()
        self._body = []
        self._enqueue(req)

    # ------------------------------------------------------------------ dispatch
    def _stop_reading_for(self, req: ClientRequest) -> None:
        """The body will not be read (too large): answer `req`, then close."""
        self._req = None
        self.in_body = False
        req.keep_alive = False
        self._enqueue(req)
        self._stop_parsing()

    def _stop_parsing(self) -> None:
        """Nothing more is read or parsed on this connection (the rest of a read included)."""
        self._parsing = False
        self._read_paused = True
        with contextlib.suppress(AttributeError, RuntimeError):
            self.transport.pause_reading()  # type: ignore[union-attr]

    def _enqueue(self, req: ClientRequest) -> None:
        if self.current is None:
            self._start(req)
        else:
            self._queue.append(req)
            if not self._read_paused:  # pipelined: parse no further until the queue drained
                self._read_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]

    def _start(self, req: ClientRequest) -> None:
        self.current = req
        self.hdr_t = BUSY
        self.started = False
        self.ended = False
        self.chunked = False
        self._pending_head = None
        self._close_after = not req.keep_alive
        self._task = self._loop.create_task(self._run(req))

    async def _run(self, req: ClientRequest) -> None:
        try:
            await self.handler(req)
        except asyncio.CancelledError:
            self._abort()
            return
        except Exception:
            log.exception("handling a request failed")
            self._abort()
            return
        finally:
            if req.held:
                req.release_body()
        self._done()

    def _done(self) -> None:
        self._task = None
        self.current = None
        if not self.ended:
            self._abort()  # the handler returned without ending its response
            return
        if self._close_after or self.closing:
            self.closing = True
            if self.transport is not None:
                self.transport.close()
            return
        self.hdr_t, self.idle_t = None, self._loop.time()
        if self._queue:
            self._start(self._queue.popleft())
            return
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def _refuse(self, response: bytes) -> None:
        """A request that cannot be parsed: answer 400/431, then close (after the response under way)."""
        transport = self.transport
        if transport is None:
            return
        if self.current is None:
            self.closing = True
            transport.write(response)
            transport.close()
        else:
            self._close_after = True
            self._stop_parsing()

    def _abort(self) -> None:
        self._task = None
        self.current = None
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def shut_down(self) -> None:
        """Shutdown: close now when idle, else right after the response under way."""
        self._close_after = True
        if self.current is None:
            self.closing = True
            if self.transport is not None:
                self.transport.close()

    def drop(self) -> None:
        """Close now (a client-side deadline or the connection cap)."""
        if self.limits is not None:
            self.limits.conns.pop(self, None)
        self._abort()

    # ------------------------------------------------------------------ responses
    def reply(self, r: Reply) -> None:
        """A whole response with Content-Length."""
        if r.close:
            self._close_after = True
        req = self.current
        data = reply_bytes(r.status, r.body, content_type=r.content_type, headers=r.headers,
                           close=self._close_after, head_only=req is not None and req.method == "HEAD")
        self.started = self.ended = True
        if not self.closing and self.transport is not None:
            self.transport.write(data)

    def reply_raw(self, status: int, reason: bytes, fields: bytes, body: bytes) -> None:
        """A relayed whole response: the upstream's field lines (hop-by-hop removed, as bytes) and its body."""
        req = self.current
        head = _head(status, reason, fields, self._close_after)
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        self.started = self.ended = True
        if not self.closing and self.transport is not None:
            self.transport.write(head if req is not None and req.method == "HEAD" else head + body)

    def start(self, status: int, reason: bytes, fields: bytes, *, length: int | None) -> None:
        """A streamed response: the head is written with the first body piece (or at the end).
        `fields`: encoded field lines; `length`: the upstream's Content-Length when it is kept; else
        chunked (HTTP/1.1) or close-delimited."""
        req = self.current
        head = _head(status, reason, fields, False)
        if req is not None and req.method == "HEAD":
            if length is not None:
                head += b"Content-Length: %d\r\n" % length
            self.chunked = False
        elif length is not None:
            head += b"Content-Length: %d\r\n" % length
        elif req is not None and req.version == "1.1":
            head += b"Transfer-Encoding: chunked\r\n"
            self.chunked = True
        else:
            self._close_after = True  # HTTP/1.0: the end of the body is the end of the connection
        if self._close_after:
            head += b"Connection: close\r\n"
        self._pending_head = head + b"\r\n"
        self.started = True

    def write(self, data: bytes) -> bool:
        """One body piece of a streamed response; False when the client is gone."""
        transport = self.transport
        if self.closing or transport is None or transport.is_closing():
            return False
        head = self._pending_head
        if self.chunked:
            if head is not None:
                self._pending_head = None
                transport.write(b"%b%x\r\n%b\r\n" % (head, len(data), data))
            else:
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        elif head is not None:
            self._pending_head = None
            transport.write(head + data)
        else:
            transport.write(data)
        return True

    def end(self, tail: bytes = b"") -> None:
        """End the streamed response (`tail`: a last piece, written with the terminator in one buffer)."""
        if self.ended:
            return
        self.ended = True
        transport = self.transport
        if self.closing or transport is None or transport.is_closing():
            return
        head = self._pending_head or b""
        self._pending_head = None
        if self.chunked:
            last = b"%x\r\n%b\r\n0\r\n\r\n" % (len(tail), tail) if tail else b"0\r\n\r\n"
        else:
            last = tail
        if head or last:
            transport.write(head + last)

    async def drain(self) -> None:
        """Until the client's buffer is below its low-water mark; ConnectionResetError when it left."""
        if self.closing and (self.transport is None or self.transport.is_closing()):
            raise ConnectionResetError("client disconnected")
        if not self.writing_paused:
            return
        fut = self._drain = self._loop.create_future()
        try:
            await fut
        finally:
            self._drain = None

    def cut(self) -> None:
        """A response that cannot end cleanly (a non-SSE body broke): the client sees a truncated body."""
        self.ended = True
        self._abort()


def _head(status: int, reason: bytes, fields: bytes, close: bool) -> bytes:
    """Status line and field lines (without the blank line); `reason` b"": the standard phrase."""
    return b"HTTP/1.1 %d %s\r\n%b%s" % (status, reason or _REASONS.get(status, b"Unknown"), fields,
                                        b"Connection: close\r\n" if close else b"")


def encode_fields(headers: Iterable[tuple[str, str]]) -> bytes:
    """`name: value\r\n` lines of the gateway's own headers (latin-1, as HTTP/1.1 field bytes)."""
    return b"".join([b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers])


async def start_server(factory: Port, host: str, port: int, *, backlog: int = 4096,
                       reuse_port: bool = False) -> asyncio.Server:
    """Listen on host:port (`reuse_port`: beside the other `--workers` processes, SO_REUSEPORT)."""
    return await asyncio.get_running_loop().create_server(factory, host, port, backlog=backlog, reuse_address=True,
                                                          reuse_port=reuse_port or None)


async def start_unix_server(factory: Port, path: str) -> asyncio.Server:
    """Listen on a Unix socket (a worker's private admin endpoint for the supervisor)."""
    return await asyncio.get_running_loop().create_unix_server(factory, path, backlog=128)


async def drain(conns: set[ClientConn], timeout: float) -> None:
    """Shutdown of one port (after it stopped accepting): idle connections close at once, busy ones after
    their response; at `timeout` whatever is left is cut."""
    for conn in list(conns):
        conn.shut_down()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while any(c.current is not None for c in conns) and loop.time() < deadline:
        await asyncio.sleep(0.02)
    for conn in list(conns):
        conn.drop()
