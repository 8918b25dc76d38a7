"""Client-side limits: header-read, body-read (minimum rate) and keep-alive idle deadlines, and a cap
on open client connections, enforced by one periodic sweep over the proxy's connections.

At the cap the oldest connection that has no request in progress is closed to make room (a slowloris
cannot starve a client that sends its request at once); when every connection is busy the new one
gets a 503 and is closed. Never reads request content and never logs per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_BUSY = -1.0  # `_hdr_t` while a request's handler runs
_REJECT = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 56\r\n"
           b"Connection: close\r\nRetry-After: 1\r\n\r\n"
           b'{"error":"slogate: too many client connections; retry"}\n')
assert len(_REJECT.rsplit(b"\r\n\r\n", 1)[1]) == 56


def connection_cap(configured: int) -> int:
    """`configured`, or (0) the open-files limit less a reserve for upstream, admin and trace fds."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    return max(16, soft - max(64, soft // 4))


class ClientLimits:
    """The deadlines, the cap and their counters, shared by every proxy connection."""

    def __init__(self, *, header: float, body: float, body_min_rate: float, idle: float, cap: int) -> None:
        self.header, self.body, self.min_rate, self.idle, self.cap = header, body, body_min_rate, idle, cap
        self.timeouts: dict[str, int] = {"header": 0, "body": 0, "idle": 0}
        self.shed: dict[str, int] = {"evicted_idle": 0, "rejected_503": 0}
        self.conns: dict[LimitedHandler, None] = {}  # insertion order: oldest first
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._sweep_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sweep_loop(self) -> None:
        interval = min(1.0, max(0.05, min(self.header, self.body, self.idle) / 4))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            self.sweep(loop.time())

    def sweep(self, now: float) -> None:
        for conn in list(self.conns):
            phase = conn.overdue(now, self)
            if phase is not None:
                self.timeouts[phase] += 1
                conn.drop()

    def admit(self, conn: LimitedHandler) -> bool:
        """Room for `conn`: evict the oldest connection without a request in progress, or refuse."""
        if len(self.conns) < self.cap:
            self.conns[conn] = None
            return True
        for old in self.conns:
            if old._hdr_t != _BUSY:
                self.shed["evicted_idle"] += 1
                old.drop()
                self.conns[conn] = None
                return True
        self.shed["rejected_503"] += 1
        return False

    def collector(self) -> Collector:
        return _Collector(self)


class LimitedHandler(RequestHandler):
    """aiohttp's connection protocol plus the bookkeeping the sweep needs (bytes in, phase times)."""

    limits: ClientLimits

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._bytes = self._bytes_at_req = 0
        self._hdr_t: float | None = None  # first byte of a request header not yet complete; _BUSY: handling
        self._idle_t = self._req_t = self._loop.time()
        if not self.limits.admit(self):
            self._manager = None  # never registered: connection_lost has nothing to undo
            transport.write(_REJECT)  # type: ignore[attr-defined]
            transport.close()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.limits.conns.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._bytes += len(data)
        if self._hdr_t is None:
            self._hdr_t = self._loop.time()
        super().data_received(data)

    def begin(self) -> None:
        self._hdr_t, self._req_t, self._bytes_at_req = _BUSY, self._loop.time(), self._bytes

    def end(self) -> None:
        self._hdr_t, self._idle_t = None, self._loop.time()

    def overdue(self, now: float, lim: ClientLimits) -> str | None:
        if self._hdr_t == _BUSY:
            req = self._current_request
            if req is None or req.content.is_eof():
                return None  # the body is in; the upstream timeouts cover the response
            allowed = lim.body + (self._bytes - self._bytes_at_req) / lim.min_rate
            return "body" if now - self._req_t > allowed else None
        if self._hdr_t is not None:
            return "header" if now - self._hdr_t > lim.header else None
        return "idle" if now - self._idle_t > lim.idle else None

    def drop(self) -> None:
        self.limits.conns.pop(self, None)
        self.force_close()


class LimitedServer(web.Server):
    """`web.Server` whose connections are `LimitedHandler`s and whose handler marks request phases."""

    def __init__(self, handler: Any, limits: ClientLimits, **kwargs: Any) -> None:
        async def phased(request: web.BaseRequest) -> web.StreamResponse:
            proto = request.protocol
            proto.begin()  # type: ignore[union-attr]
            try:
                return await handler(request)
            finally:
                proto.end()  # type: ignore[union-attr]

        # aiohttp's own keep-alive close stays as a backstop behind the sweep (which counts what it closes)
        super().__init__(phased, keepalive_timeout=limits.idle + 2 * limits.header + 1, **kwargs)
        self.limits = limits
        self._handler_cls = type("Handler", (LimitedHandler,), {"limits": limits})

    def __call__(self) -> RequestHandler:
        return self._handler_cls(self, loop=self._loop, **self._kwargs)


class _Collector(Collector):
    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits

    def collect(self) -> Iterable:
        lim = self.limits
        t = CounterMetricFamily("slogate_client_timeouts", "Client connections closed by a client-side deadline.",
                                labels=["phase"])
        for phase, n in lim.timeouts.items():
            t.add_metric([phase], n)
        yield t
        s = CounterMetricFamily("slogate_client_connections_shed",
                                "Client connections closed or refused at the connection cap.", labels=["action"])
        for action, n in lim.shed.items():
            s.add_metric([action], n)
        yield s
        open_ = GaugeMetricFamily("slogate_client_connections",
                                  "Open client connections on the proxy port: with a request in progress or waiting.",
                                  labels=["state"])
        busy = sum(1 for c in lim.conns if c._hdr_t == _BUSY)
        open_.add_metric(["busy"], busy)
        open_.add_metric(["waiting"], len(lim.conns) - busy)
        yield open_
