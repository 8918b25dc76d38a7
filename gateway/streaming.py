"""Streaming one upstream response body to the client as it is decoded, with flow control.

Push-based: the upstream connection calls `Stream.on_piece` from `data_received` for each decoded
body piece; it feeds the observer and writes the piece (chunk-framed) straight to the client
transport. When the client's buffer is above its high-water mark, upstream reading pauses until
the client drained (`pump`). Never decodes JSON (the observer scans bytes), never allocates a task
or closure per request or per chunk.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from slogate.gateway.overhead import Overhead
from slogate.gateway.routing.upstreams import Lease
from slogate.gateway.timeouts import Watchdog
from slogate.gateway.upstream_conn import UpstreamConn
from slogate.traces.observer import StreamObserver


class ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class Stream:
    """The relay of one response body: the sink the upstream connection pushes pieces into."""

    __slots__ = ("chunked", "client_gone", "conn", "last_out", "lease", "obs", "overhead", "protocol", "seen",
                 "t_last", "transport", "wd")

    def __init__(self, conn: UpstreamConn, obs: StreamObserver | None, lease: Lease, wd: Watchdog,
                 overhead: Overhead, request: Any, chunked: bool) -> None:
        self.conn = conn
        self.obs = obs
        self.lease = lease  # drawn down as output arrives (the router's in-flight token estimate)
        self.wd = wd
        self.overhead = overhead
        self.transport = request.transport
        self.protocol = request.protocol
        self.chunked = chunked  # the client response is chunk-framed
        self.client_gone = False
        self.last_out = b"\n\n"  # the last bytes forwarded (does an error event start on a fresh line?)
        self.seen = 0  # output chunks already drawn from the lease
        self.t_last = perf_counter_ns()  # arrival of the last piece

    def on_piece(self, data: bytes, t: int) -> None:
        """One decoded upstream body piece (called from the connection's `data_received`)."""
        self.t_last = self.wd.last_ns = t
        obs = self.obs
        if obs is not None:
            data = obs.feed(data, t)
            n = obs.output_chunks
            if n != self.seen:
                self.lease.on_tokens(n - self.seen)  # draw down the in-flight token estimate
                self.seen = n
            if not data:
                self.overhead.sink_ns += perf_counter_ns() - t
                return
        self.last_out = data
        transport = self.transport
        if transport is None or transport.is_closing():
            self.client_gone = True
            self.conn.pause_reading()
            return
        if self.chunked:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # one buffer: one send
        else:
            transport.write(data)
        if self.protocol.writing_paused:  # client buffer above its high-water mark: stop reading upstream
            self.conn.pause_reading()
        self.overhead.sink_ns += perf_counter_ns() - t

    async def pump(self, writer: Any) -> None:
        """Until the upstream body ended. Raises ClientGone, UpstreamError or CancelledError."""
        conn = self.conn
        overhead = self.overhead
        conn.stream_to(self.on_piece)
        while True:
            overhead.wait_start()
            done = await conn.wait_body()
            overhead.wait_end()
            if self.client_gone:
                raise ClientGone
            if done:
                return
            try:
                await writer.drain()  # the client catches up, then upstream reading resumes
            except ConnectionResetError:
                raise ClientGone from None
            conn.resume_reading()
