"""Streaming one upstream response body to the client as it is decoded, with flow control.

Push-based: the upstream connection calls `Stream.on_piece` from `data_received` for each decoded
body piece; it feeds the observer and writes the piece (chunk-framed, with the response head when it
is the first) straight to the client connection. The piece that ends the body (or carries
`data: [DONE]`) is written with the end of the response in one buffer; nothing after `[DONE]` is
forwarded. When the client's buffer is above its high-water mark, upstream
reading pauses until the client drained (`pump`). Never decodes JSON (the observer scans bytes),
never allocates a task or closure per request or per chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns

from slogate.gateway.http_server import ClientConn
from slogate.gateway.overhead import Overhead
from slogate.gateway.routing.upstreams import Lease
from slogate.gateway.timeouts import Watchdog
from slogate.gateway.upstream_conn import UpstreamConn
from slogate.traces.observer import StreamObserver


class ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class Stream:
    """The relay of one response body: the sink the upstream connection pushes pieces into."""

    __slots__ = ("client", "client_gone", "conn", "end_with", "finished", "last_out", "lease", "obs", "overhead", "seen",
                 "t_last", "wd")

    def __init__(self, conn: UpstreamConn, obs: StreamObserver | None, lease: Lease, wd: Watchdog,
                 overhead: Overhead, client: ClientConn, end_with: Callable[[bytes, int], None]) -> None:
        self.conn = conn
        self.obs = obs
        self.lease = lease  # drawn down as output arrives (the router's in-flight token estimate)
        self.wd = wd
        self.overhead = overhead
        self.client = client
        self.end_with = end_with  # the exchange's end of a body: record, then write the last piece + end
        self.client_gone = False
        self.finished = False  # [DONE] went to the client: its response ended, whatever the upstream does next
        self.last_out = b"\n\n"  # the last bytes forwarded (does an error event start on a fresh line?)
        self.seen = 0  # output chunks already drawn from the lease
        self.t_last = perf_counter_ns()  # arrival of the last piece

    def on_piece(self, data: bytes, t: int) -> None:
        """One decoded upstream body piece (called from the connection's `data_received`)."""
        self.t_last = self.wd.last_ns = t
        obs = self.obs
        if obs is not None:
            if self.finished:  # after [DONE]: counted by the observer, never forwarded
                obs.feed(data, t)
                return
            data = obs.feed(data, t)
            n = obs.output_chunks
            if n != self.seen:
                self.lease.on_tokens(n - self.seen)  # draw down the in-flight token estimate
                self.seen = n
            if obs.done:  # the stream is complete for the client: end its response with this piece
                self.finished = True
                self.end_with(data, t)
                if not self.conn.body_done:
                    self.conn.pause_reading()  # wakes `pump`; the pool reads the rest (gateway.upstream)
                self.overhead.sink_ns += perf_counter_ns() - t
                return
        client = self.client
        if client.closing:
            self.client_gone = True
            self.conn.pause_reading()
        elif self.conn.body_done:
            self.end_with(data, t)
        elif data:
            self.last_out = data
            client.write(data)
            if client.writing_paused:  # client buffer above its high-water mark: stop reading upstream
                self.conn.pause_reading()
        self.overhead.sink_ns += perf_counter_ns() - t

    async def pump(self) -> None:
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
            if done or self.finished:
                return
            try:
                await self.client.drain()  # the client catches up, then upstream reading resumes
            except ConnectionResetError:
                raise ClientGone from None
            conn.resume_reading()
