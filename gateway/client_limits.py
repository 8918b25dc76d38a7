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
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

BUSY = -1.0  # `hdr_t` while a request's handler runs
REJECT = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 56\r\n"
           b"Connection: close\r\nRetry-After: 1\r\n\r\n"
           b'{"error":"slogate: too many client connections; retry"}\n')
assert len(REJECT.rsplit(b"\r\n\r\n", 1)[1]) == 56


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
        self.malformed = 0  # requests answered 400/431 because they could not be parsed
        self.conns: dict[LimitedConn, None] = {}  # insertion order: oldest first
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
            phase = overdue(conn, now, self)
            if phase is not None:
                self.timeouts[phase] += 1
                conn.drop()

    def admit(self, conn: LimitedConn) -> bool:
        """Room for `conn`: evict the oldest connection without a request in progress, or refuse."""
        if len(self.conns) < self.cap:
            self.conns[conn] = None
            return True
        for old in self.conns:
            if not busy(old):
                self.shed["evicted_idle"] += 1
                old.drop()
                self.conns[conn] = None
                return True
        self.shed["rejected_503"] += 1
        return False

    def collector(self) -> Collector:
        return _Collector(self)


class LimitedConn(Protocol):
    """What the sweep reads of a proxy connection (gateway.http_server.ClientConn)."""

    hdr_t: float | None  # first byte of an incomplete head; BUSY while a handler runs
    in_body: bool  # the head is in, the body is not
    req_t: float  # when the head was complete
    idle_t: float  # when the last response ended
    bytes_in: int
    bytes_at_req: int

    def drop(self) -> None: ...


def busy(conn: LimitedConn) -> bool:
    """A request is in progress: its body is being read or its handler runs."""
    return conn.in_body or conn.hdr_t == BUSY


def overdue(conn: LimitedConn, now: float, lim: ClientLimits) -> str | None:
    """The deadline `conn` missed ("header", "body", "idle"), or None."""
    hdr_t = conn.hdr_t
    if hdr_t == BUSY:
        return None  # the request is in; the upstream timeouts cover the response
    if conn.in_body:
        allowed = lim.body + (conn.bytes_in - conn.bytes_at_req) / lim.min_rate
        return "body" if now - conn.req_t > allowed else None
    if hdr_t is not None:
        return "header" if now - hdr_t > lim.header else None
    return "idle" if now - conn.idle_t > lim.idle else None


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
        yield CounterMetricFamily("slogate_client_requests_malformed",
                                  "Client requests answered 400/431 because they were not valid HTTP/1.1.",
                                  value=lim.malformed)
        open_ = GaugeMetricFamily("slogate_client_connections",
                                  "Open client connections on the proxy port: with a request in progress or waiting.",
                                  labels=["state"])
        n_busy = sum(1 for c in lim.conns if busy(c))
        open_.add_metric(["busy"], n_busy)
        open_.add_metric(["waiting"], len(lim.conns) - n_busy)
        yield open_
