"""One relayed request: the attempts over upstreams, the response (small or streamed), its record.

`Exchange` is a plain object per request (no per-request closures or tasks). Before any byte reached
the client it may move to another upstream when the router allows it (connect error, reset before
the response, 503); after that a failure ends the response (gateway.failures). Every way out records
the request exactly once with its error class (traces.record.ErrorClass). Never decodes JSON per
chunk and never logs per request.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter_ns
from typing import Any, Protocol, cast

from slogate.gateway import assemble
from slogate.gateway.errors import json_error, status_of
from slogate.gateway.failures import end_late
from slogate.gateway.headers import forward_request_fields, forward_response_fields
from slogate.gateway.http_server import ClientRequest
from slogate.gateway.overhead import Overhead
from slogate.gateway.recorder import Recorder
from slogate.gateway.routing.health import HTTP_503, OTHER, outcome_of
from slogate.gateway.routing.router import Router, RouteRequest
from slogate.gateway.routing.upstreams import Lease
from slogate.gateway.streaming import ClientGone, Stream
from slogate.gateway.timeouts import Deadlines, Watchdog
from slogate.gateway.trace_context import child_traceparent
from slogate.gateway.upstream import Upstream
from slogate.gateway.upstream_conn import UpstreamConn, UpstreamError
from slogate.traces.http1 import Head, request_bytes
from slogate.traces.observer import StreamObserver
from slogate.traces.record import ERROR_CLASSES, ErrorClass
from slogate.traces.request_info import RequestInfo

log = logging.getLogger("slogate.gateway")

_SMALL_BODY = 1 << 20  # non-streamed responses up to this size are relayed in one write
_SPLIT_BODY = 1 << 16  # request bodies from this size go to the upstream in their own write

# gateway.upstream raises these codes (UpstreamError.code); their error class. One small table so the
# connection layer can switch to ErrorClass names later (a code already in ERROR_CLASSES passes through).
UPSTREAM_ERRORS: dict[str, ErrorClass] = {
    "upstream_connect": "connect", "timeout_connect": "timeout_connect", "upstream_error": "protocol",
    "reset": "reset",
}


def upstream_error_class(exc: UpstreamError) -> ErrorClass:
    code = exc.code
    found = UPSTREAM_ERRORS.get(code)
    if found is not None:
        return found
    return cast(ErrorClass, code) if code in ERROR_CLASSES else "protocol"


class Shared(Protocol):
    """What an exchange reads of the gateway-wide state (gateway.relay.Relay)."""

    deadlines: Deadlines
    limits: tuple[int | None, int | None, int | None]
    active: set[Watchdog]
    router: Router
    recorder: Recorder
    start_ns: int
    stopping: bool
    propagate: bool  # --otel: send the gateway span's traceparent upstream


class Exchange:
    """State of one relayed request (see the module docstring)."""

    __slots__ = (
        "body", "client", "conn", "info", "lease", "obs", "outcome", "overhead", "parsed", "relay", "request",
        "route", "sent_ids", "sse", "status", "stream", "strip", "t0", "t_admitted", "tpot", "ttft", "upstream", "wd",
    )

    def __init__(self, relay: Shared, request: ClientRequest, route: RouteRequest, lease: Lease,
                 info: RequestInfo | None, parsed: Any, body: bytes | bytearray, strip: bool, t0: int, t_admitted: int) -> None:
        self.relay = relay
        self.request = request
        self.client = request.conn  # where the response goes
        self.status = 0
        self.sse = False  # the response is an event stream (an error after the head is an SSE event)
        self.route = route
        self.lease = lease  # the router's claim on the upstream (in-flight requests and tokens)
        self.upstream: Upstream = lease.upstream.target  # type: ignore[assignment]
        self.outcome = OTHER  # for the router's health accounting, set when the request is recorded
        self.ttft: float | None = None
        self.tpot: float | None = None
        self.info = info  # None once recorded (or for unmeasured paths)
        self.parsed = parsed
        self.body = body
        self.strip = strip
        self.sent_ids: tuple[str, str] | None = None  # (trace id, span id) of the traceparent sent upstream
        self.t0 = t0
        self.t_admitted = t_admitted  # body read and admission passed: the start of the gateway's overhead
        self.obs: StreamObserver | None = None
        self.conn: UpstreamConn | None = None
        self.stream: Stream | None = None
        self.overhead = Overhead()
        self.wd: Watchdog | None = None

    async def run(self) -> None:
        self.wd = wd = Watchdog(self.relay.deadlines, self.relay.limits, self.t0)
        active = self.relay.active
        active.add(wd)
        try:
            await self._attempts(wd)
        except Exception:
            if self.client.started:
                raise  # the response is under way: the server cuts the connection
            log.exception("relaying a request failed")  # a bug: answered 500 and recorded
            self._fail_early("gateway_error", None)
        finally:
            active.discard(wd)
            wd.stop()
            self.relay.router.release(self.lease, self.outcome, self.ttft, self.tpot)
            self._release_conn()

    def _release_conn(self) -> None:
        conn = self.conn
        if conn is not None:
            self.conn = None
            pool = self.upstream.pool
            if pool is not None:  # reused after a complete exchange (or one past [DONE]); aborted otherwise
                pool.release(conn, finish_body=self.stream is not None and self.stream.finished)
            else:
                conn.abort()

    # ------------------------------------------------------------------ attempts over upstreams
    async def _attempts(self, wd: Watchdog) -> None:
        request = self.request
        traceparent = None
        if self.relay.propagate:  # --otel: the gateway's span is the upstream request's parent
            traceparent, trace_id, span_id = child_traceparent(request.headers.get("traceparent"))
            self.sent_ids = (trace_id, span_id)
        headers = forward_request_fields(request.headers, injected=self.strip, traceparent=traceparent)
        overhead = self.overhead
        while True:  # one pass per attempt; another only while nothing went to the client
            up = self.upstream
            body = self.body
            split = len(body) >= _SPLIT_BODY  # a large body is written after its head, never copied into it
            data = request_bytes(request.method, up.prefix + request.raw_path, up.host_header, headers, body,
                                 head_only=split)
            wd.waiting_first_byte(overhead.wait_start())
            try:
                self.conn, head = await up.exchange(data, no_body=request.method == "HEAD",
                                                    body=body if split else b"")
            except asyncio.CancelledError:
                return self._cancelled_early(wd)
            except UpstreamError as exc:
                overhead.wait_end()
                code = upstream_error_class(exc)
                if self._retry(outcome_of(status_of(code), code, started=False)):
                    continue
                # The detail names the upstream only: never bytes of its response (they may echo the request).
                return self._fail_early(code, up.name)
            t_head = overhead.wait_end()
            if head.status == 503 and self._retry(HTTP_503):  # overloaded or draining: try another upstream
                continue
            break
        del body, data
        self.body = b""
        request.release_body()  # the upstream has it: its bytes go back to the in-flight budget
        wd.streaming(t_head)
        await self._respond(self.conn, head, wd)

    def _retry(self, outcome: str) -> bool:
        """Before any byte reached the client: move to another upstream when the router allows it."""
        lease = self.relay.router.retry(self.route, self.lease, outcome)
        if lease is None:
            return False
        self._release_conn()  # to the pool it came from: reused if its (error) body was complete, else aborted
        self.lease = lease
        self.upstream = lease.upstream.target  # type: ignore[assignment]
        return True

    # ------------------------------------------------------------------ the response
    async def _respond(self, conn: UpstreamConn, head: Head, wd: Watchdog) -> None:
        status = head.status
        self.status = status
        ok = 200 <= status < 300
        self.sse = head.content_type.startswith(b"text/event-stream")
        is_sse = ok and self.sse
        encoded = head.content_encoding not in (b"identity", b"")
        strip = self.strip and is_sse and not encoded
        if self.info is not None:
            self.obs = StreamObserver(
                self.t0, stream=is_sse and not encoded, endpoint=self.info.endpoint, strip_usage=strip,
                keep_chunk_times=True, n_inputs=self.info.n_inputs,  # ITL histogram (and trace chunk offsets)
            )
        length = head.length
        head_only = self.request.method == "HEAD"
        if not is_sse and length is not None and length <= _SMALL_BODY and not head_only:
            return await self._respond_small(conn, head, wd)
        keep_length = length is not None and not strip  # else chunked toward the client (HTTP/1.1)
        self.client.start(status, head.raw_reason, forward_response_fields(head, drop_length=True),
                          length=length if keep_length else None)
        self.stream = Stream(conn, self.obs, self.lease, wd, self.overhead, self.client, self._end_in_place)
        await self._stream(self.stream, wd, status)

    async def _respond_small(self, conn: UpstreamConn, head: Head, wd: Watchdog) -> None:
        """A small non-streamed body: read whole, then relayed in one write."""
        pieces: list[bytes] = []
        overhead = self.overhead
        overhead.wait_start()
        try:
            conn.stream_to(lambda piece, t: pieces.append(piece))
            await conn.wait_body()
        except asyncio.CancelledError:
            return self._cancelled_early(wd)
        except UpstreamError as exc:
            return self._fail_early(upstream_error_class(exc), self.upstream.name)
        t_end = overhead.wait_end()
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if self.obs is not None and data:
            self.obs.feed(data, t_end)
        self.record(t_end, head.status, None)
        self.client.reply_raw(head.status, head.raw_reason, forward_response_fields(head, drop_length=True), data)

    def _end_in_place(self, data: bytes, t: int) -> None:
        """The upstream body ended with this piece (called from the upstream read): record the request,
        then write the piece, any held-back tail and the end of the response in one buffer."""
        obs = self.obs
        tail = obs.flush() if obs is not None else b""
        if tail:
            data += tail
        if data:
            assert self.stream is not None
            self.stream.last_out = data
        self.record(t, self.status, None)  # counted before the end: a client that saw it finds it in /metrics
        self.client.end(data)

    async def _stream(self, stream: Stream, wd: Watchdog, status: int) -> None:
        client = self.client
        try:
            await stream.pump()
            obs = self.obs
            tail = obs.flush() if obs is not None else b""
            if tail:
                stream.last_out = tail
            # Counted before the final chunk: a client that has seen the end finds it in /metrics.
            self.record(stream.t_last, status, None)
            if client.closing and not client.ended:
                raise ClientGone
            client.end(tail)
        except asyncio.CancelledError:
            if wd.fired is None:  # client went away (or hard shutdown): abort upstream, re-raise
                self.record(None, status, self._cancel_reason())  # E2E to now: when the request ended, as Envoy's
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return self._fail_late(cast(ErrorClass, wd.fired), status)
        except ClientGone:
            self.record(None, status, "client_disconnect")  # E2E to when the gateway saw the client gone
            client.cut()
        except UpstreamError as exc:
            return self._fail_late(upstream_error_class(exc), status)

    # ------------------------------------------------------------------ failures
    def _cancel_reason(self) -> ErrorClass:
        return "shutdown" if self.relay.stopping else "client_disconnect"

    def _cancelled_early(self, wd: Watchdog) -> None:
        """Cancelled before anything reached the client: by the watchdog (a timeout, answered with a
        JSON error) or because the client left (recorded as 499, cancellation re-raised)."""
        self.overhead.wait_end()
        if wd.fired is None:
            self.record(None, 499, self._cancel_reason())
            raise  # the CancelledError being handled by the caller
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        self._fail_early(cast(ErrorClass, wd.fired), None)

    def _fail_early(self, code: ErrorClass, detail: str | None) -> None:
        """Nothing was sent to the client yet: an OpenAI-style JSON error."""
        self.record(None, status_of(code), code)
        self.client.reply(json_error(code, detail))

    def _fail_late(self, code: ErrorClass, status: int) -> None:
        """Headers (and maybe chunks) already went out: an SSE error event + [DONE], or a cut connection."""
        if self.conn is not None:
            self.conn.abort()
        stream = self.stream
        assert stream is not None
        # a deadline's e2e is how long the client waited (now), a broken upstream's its last byte
        self.record(None if code.startswith("timeout") else stream.t_last, status, code)
        end_late(self.client, code, sse=self.sse, last_out=stream.last_out)

    # ------------------------------------------------------------------ record
    def record(self, t_last: int | None, status: int, error: ErrorClass | None) -> None:
        """Record the request once (later calls only keep the first health outcome)."""
        if self.outcome == OTHER:
            self.outcome = outcome_of(status, error, started=self.client.started)
        info = self.info
        if info is None:
            return
        self.info = None  # record once
        t_end = perf_counter_ns()
        obs = self.obs
        answered = self.sse if 200 <= self.status < 300 else None  # status 0: no response head
        if obs is None:
            obs = self.obs = StreamObserver(self.t0, stream=False, endpoint=info.endpoint)
        relay = self.relay
        router = relay.router
        record = assemble.exchange_record(
            obs, info, t0_ns=self.t0, start_ns=relay.start_ns, t_done=t_last if t_last is not None else t_end,
            status=status, error=error, upstream=self.upstream.name,
            pool=self.lease.pool if router.several_pools else None,
            queue=self.lease.queue_s if router.admission else None,
            overhead_ns=self.overhead.busy_ns(self.t_admitted, t_end), answered_stream=answered,
        )
        if record.error is None:
            self.ttft, self.tpot = record.ttft, record.tpot
        assemble.hand_off(relay.recorder, record, self.parsed, self.request.headers, self.sent_ids)
