"""Relay: the hot path. One client request → one upstream request, the response streamed back as it arrives.

Reads the body once, parses JSON once (orjson) for LLM endpoints only, forwards headers minus
hop-by-hop, writes every upstream piece to the client as it is decoded (never line iteration) and
feeds the `traces` StreamObserver. Never decodes JSON per chunk, never logs per request, never
blocks, never opens a connection per request when a pooled one is idle.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter_ns
from typing import Any

import orjson
from aiohttp import HttpVersion11, web
from multidict import CIMultiDict

from slogate.gateway.config import GatewayConfig
from slogate.gateway.errors import json_error, sse_error, status_of
from slogate.gateway.recorder import Recorder
from slogate.gateway.routing.admission import Rejected, parse_priority, rejection_response
from slogate.gateway.routing.health import HTTP_503, OTHER, outcome_of
from slogate.gateway.routing.router import Router, RouteRequest
from slogate.gateway.routing.upstreams import Lease
from slogate.gateway.timeouts import Deadlines, Watchdog, limits_ns
from slogate.gateway.upstream import Upstream
from slogate.gateway.upstream_conn import UpstreamConn, UpstreamError
from slogate.traces.http1 import Head, request_bytes
from slogate.traces.observer import StreamObserver
from slogate.traces.record import RequestRecord
from slogate.traces.request_info import MEASURED_ENDPOINTS, RequestInfo, request_info, with_usage_requested

log = logging.getLogger("slogate.gateway")

# RFC 9110 §7.6.1 connection-specific fields, plus the pre-standard Proxy-Connection.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
# When the gateway injects include_usage it must be able to read (and strip) the stream: ask for identity.
_REQUEST_DROP_INJECTED = _REQUEST_DROP | {"accept-encoding"}
_USAGE_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})  # stream_options exists there
_SMALL_BODY = 1 << 20  # non-streamed responses up to this size are relayed in one write
NS = 1e-9


def _drop_set(headers: Any, base: frozenset[str]) -> frozenset[str]:
    """Hop-by-hop names plus any listed in the Connection header."""
    conn = headers.get("Connection")
    if not conn:
        return base
    return base | {t.strip().lower() for t in conn.split(",") if t.strip()}


def forward_request_headers(headers: Any, *, injected: bool = False) -> CIMultiDict[str]:
    drop = _drop_set(headers, _REQUEST_DROP_INJECTED if injected else _REQUEST_DROP)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def forward_response_headers(headers: Any, *, drop_length: bool) -> CIMultiDict[str]:
    drop = _drop_set(headers, HOP_BY_HOP)
    if drop_length:
        drop = drop | {"content-length"}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


async def _continue(request: web.Request) -> None:
    """`Expect: 100-continue` (curl sends it for large bodies): tell the client to send the body."""
    if request.headers["Expect"].lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


class _ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class Relay:
    """The aiohttp handler for every proxied path."""

    def __init__(self, cfg: GatewayConfig, router: Router, recorder: Recorder, start_ns: int,
                 deadlines: Deadlines) -> None:
        self.cfg = cfg
        self.deadlines = deadlines
        self.limits = limits_ns(cfg.timeouts)
        self.router = router
        self.recorder = recorder
        self.start_ns = start_ns
        self.max_body = cfg.max_body_bytes
        self.inject_usage = cfg.inject_usage
        self.priority_header = cfg.routing.priority_header
        self.keep_chunk_times = True  # ITL histogram (and optional trace chunk offsets)
        self.stopping = False  # set on SIGTERM
        self.active: set[Watchdog] = set()  # one per request in flight (ended at the grace deadline)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t0 = perf_counter_ns()
        path = request.path
        measured = request.method == "POST" and path in MEASURED_ENDPOINTS
        length = request.content_length
        if length is not None and length > self.max_body:
            return self._too_large(t0, path, measured, length)
        if "Expect" in request.headers and request.version == HttpVersion11:
            await _continue(request)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large(t0, path, measured, None)
        t_body = perf_counter_ns()
        parsed: Any = None
        info: RequestInfo | None = None
        send = body
        strip = False
        if measured:
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None  # relayed unchanged: the upstream answers (400) and it is recorded
            info = request_info(path, parsed)
            if info.stream and not info.include_usage and self.inject_usage and path in _USAGE_ENDPOINTS:
                send = with_usage_requested(parsed)
                strip = True
        router = self.router
        priority = parse_priority(request.headers.get(self.priority_header)) if router.admission else 0
        route = router.request(info, parsed, priority)
        try:
            lease = await router.acquire(route)  # waits only when admission limits are set
        except Rejected as rejected:
            self._record_unsent(t0, info, 429, rejected.reason, rejected.pool, rejected.queue_s)
            return rejection_response(rejected)
        except asyncio.CancelledError:  # the client hung up while queued: record it, then unwind
            self._record_unsent(t0, info, 499, "shutdown" if self.stopping else "client_disconnect",
                                route.pool, route.queue_s)
            raise
        return await _Exchange(self, request, route, lease, info, parsed, send, strip, t0, t_body).run()

    def _record_unsent(self, t0: int, info: RequestInfo | None, status: int, error: str, pool: str | None,
                       queue_s: float | None) -> None:
        """A measured request that never reached an upstream (admission 429, or the client left the
        queue): recorded with its queue time; it counts against SLO attainment."""
        if info is None:
            return
        obs = StreamObserver(t0, stream=False, endpoint=info.endpoint)
        record = obs.finish(perf_counter_ns(), status=status, error=error)
        record.t = (t0 - self.start_ns) * NS
        record.model = info.model
        record.stream = info.stream
        record.max_tokens = info.max_tokens
        record.pool = pool
        record.queue = queue_s
        self.recorder.finish(record, None)

    def expire_all(self, reason: str = "shutdown") -> int:
        """End every request in flight (JSON error before the first byte, error event + [DONE] after)."""
        for wd in list(self.active):
            wd.expire(reason)
        return len(self.active)

    def _too_large(self, t0: int, path: str, measured: bool, length: int | None) -> web.Response:
        detail = f"limit {self.max_body} bytes" + (f", got {length}" if length is not None else "")
        if measured:
            obs = StreamObserver(t0, stream=False, endpoint=path)
            record = obs.finish(perf_counter_ns(), status=413, error="request_too_large")
            record.t = (t0 - self.start_ns) * NS
            self.recorder.finish(record, None)
        resp = json_error("request_too_large", detail)
        resp.force_close()  # the unread body must not be parsed as the next request
        return resp


class _Exchange:
    """State of one relayed request (a plain object: no per-request closures or tasks).

    Streaming is push-based: the upstream connection calls `_on_piece` from `data_received` for each
    decoded body piece; it feeds the observer and writes the piece (chunk-framed) straight to the
    client transport. The relay task only awaits the head, a flow-control pause and the end.
    """

    __slots__ = (
        "body", "chunked", "client_gone", "conn", "info", "last_out", "lease", "obs", "outcome", "parsed",
        "protocol", "relay", "request", "resp", "route", "seen", "sink_ns", "strip", "t0", "t_body", "t_last",
        "tpot", "transport", "ttft", "upstream", "wait_ns", "wd",
    )

    def __init__(self, relay: Relay, request: web.Request, route: RouteRequest, lease: Lease,
                 info: RequestInfo | None, parsed: Any, body: bytes, strip: bool, t0: int, t_body: int) -> None:
        self.relay = relay
        self.request = request
        self.route = route
        self.lease = lease  # the router's claim on the upstream (in-flight requests and tokens)
        self.upstream: Upstream = lease.upstream.target  # type: ignore[assignment]
        self.outcome = OTHER  # for the router's health accounting, set when the request is recorded
        self.ttft: float | None = None
        self.tpot: float | None = None
        self.info = info
        self.parsed = parsed
        self.body = body
        self.strip = strip
        self.t0 = t0
        self.t_body = t_body
        self.obs: StreamObserver | None = None
        self.resp: web.StreamResponse | None = None
        self.conn: UpstreamConn | None = None
        self.wait_ns = 0  # time spent waiting on the upstream (headers + body), sink time included
        self.sink_ns = 0  # time spent in `_on_piece` (gateway work inside those waits)
        self.last_out = b"\n\n"
        self.seen = 0
        self.t_last = 0
        self.client_gone = False
        self.chunked = False
        self.transport: Any = None
        self.protocol: Any = None
        self.wd: Watchdog | None = None

    async def run(self) -> web.StreamResponse:
        self.wd = wd = Watchdog(self.relay.deadlines, self.relay.limits, self.t0)
        active = self.relay.active
        active.add(wd)
        try:
            return await self._exchange(wd)
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
            if pool is not None:
                pool.release(conn)  # reused after a complete exchange; aborts the upstream otherwise
            else:
                conn.abort()

    async def _exchange(self, wd: Watchdog) -> web.StreamResponse:
        request = self.request
        headers = forward_request_headers(request.headers, injected=self.strip).items()
        while True:  # one pass per attempt; another only while nothing went to the client
            up = self.upstream
            data = request_bytes(request.method, up.prefix + request.raw_path, up.host_header, headers, self.body)
            t_up = perf_counter_ns()
            wd.waiting_first_byte(t_up)
            try:
                self.conn, head = await up.exchange(data, no_body=request.method == "HEAD")
            except asyncio.CancelledError:
                return self._cancelled_early(wd, t_up)
            except UpstreamError as exc:
                self.wait_ns += perf_counter_ns() - t_up
                if self._retry(outcome_of(status_of(exc.code), exc.code, started=False)):
                    continue
                # The detail names the upstream only: never bytes of its response (they may echo the request).
                return self._fail_early(exc.code, up.name if exc.code != "upstream_error" else "invalid HTTP response")
            if head.status == 503 and self._retry(HTTP_503):  # overloaded or draining: try another upstream
                self.wait_ns += perf_counter_ns() - t_up
                continue
            break
        t_hdr = perf_counter_ns()
        self.wait_ns += t_hdr - t_up
        wd.streaming(t_hdr)
        return await self._respond(self.conn, head, wd)

    def _retry(self, outcome: str) -> bool:
        """Before any byte reached the client: move to another upstream when the router allows it."""
        lease = self.relay.router.retry(self.route, self.lease, outcome)
        if lease is None:
            return False
        self._release_conn()  # to the pool it came from: reused if its (error) body was complete, else aborted
        self.lease = lease
        self.upstream = lease.upstream.target  # type: ignore[assignment]
        return True

    async def _respond(self, conn: UpstreamConn, head: Head, wd: Watchdog) -> web.StreamResponse:
        status = head.status
        headers = head.headers
        ok = 200 <= status < 300
        is_sse = ok and headers.get("Content-Type", "").startswith("text/event-stream")
        encoded = headers.get("Content-Encoding", "identity").lower() not in ("identity", "")
        strip = self.strip and is_sse and not encoded
        if self.info is not None:
            self.obs = StreamObserver(
                self.t0, stream=is_sse and not encoded, endpoint=self.info.endpoint, strip_usage=strip,
                keep_chunk_times=self.relay.keep_chunk_times, n_inputs=self.info.n_inputs,
            )
        length = head.length
        if not is_sse and length is not None and length <= _SMALL_BODY and self.request.method != "HEAD":
            return await self._respond_small(conn, head, wd)
        resp = web.StreamResponse(status=status, reason=head.reason,
                                  headers=forward_response_headers(headers, drop_length=strip))
        self.resp = resp
        writer = await resp.prepare(self.request)
        self.chunked = bool(getattr(writer, "chunked", False))
        self.transport = self.request.transport
        self.protocol = self.request.protocol
        return await self._stream(conn, resp, wd, status)

    def _cancelled_early(self, wd: Watchdog, t_wait: int) -> web.Response:
        """Cancelled before anything reached the client: by the watchdog (a timeout, answered with a
        JSON error) or because the client left (recorded as 499, cancellation re-raised)."""
        self.wait_ns += perf_counter_ns() - t_wait
        if wd.fired is None:
            self._record(None, 499, self._cancel_reason())
            raise  # the CancelledError being handled by the caller
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return self._fail_early(wd.fired, None)

    async def _respond_small(self, conn: UpstreamConn, head: Head, wd: Watchdog) -> web.StreamResponse:
        pieces: list[bytes] = []
        t_a = perf_counter_ns()
        try:
            conn.stream_to(lambda piece, t: pieces.append(piece))
            await conn.wait_body()
        except asyncio.CancelledError:
            return self._cancelled_early(wd, t_a)
        except UpstreamError:
            self.wait_ns += perf_counter_ns() - t_a
            return self._fail_early("reset", self.upstream.name)
        t_b = perf_counter_ns()
        self.wait_ns += t_b - t_a
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if self.obs is not None and data:
            self.obs.feed(data, t_b)
        resp = web.Response(status=head.status, reason=head.reason, body=data,
                            headers=forward_response_headers(head.headers, drop_length=True))
        self._record(t_b, head.status, None)
        return resp

    def _on_piece(self, data: bytes, t: int) -> None:
        """One decoded upstream body piece (called from the connection's `data_received`)."""
        self.t_last = self.wd.last_ns = t  # type: ignore[union-attr]
        obs = self.obs
        if obs is not None:
            data = obs.feed(data, t)
            n = obs.output_chunks
            if n != self.seen:
                self.lease.on_tokens(n - self.seen)  # draw down the in-flight token estimate
                self.seen = n
            if not data:
                self.sink_ns += perf_counter_ns() - t
                return
        self.last_out = data
        transport = self.transport
        if transport is None or transport.is_closing():
            self.client_gone = True
            self.conn.pause_reading()  # type: ignore[union-attr]
            return
        if self.chunked:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # one buffer: one send
        else:
            transport.write(data)
        if self.protocol.writing_paused:  # client buffer above its high-water mark: stop reading upstream
            self.conn.pause_reading()  # type: ignore[union-attr]
        self.sink_ns += perf_counter_ns() - t

    async def _stream(self, conn: UpstreamConn, resp: web.StreamResponse, wd: Watchdog,
                      status: int) -> web.StreamResponse:
        obs = self.obs
        self.t_last = perf_counter_ns()
        wait = 0
        try:
            conn.stream_to(self._on_piece)
            while True:
                t_a = perf_counter_ns()
                done = await conn.wait_body()
                wait += perf_counter_ns() - t_a
                if self.client_gone:
                    raise _ClientGone
                if done:
                    break
                try:
                    await self.request.writer.drain()  # the client catches up, then upstream reading resumes
                except ConnectionResetError:
                    raise _ClientGone from None
                conn.resume_reading()
            try:
                if obs is not None:
                    tail = obs.flush()
                    if tail:
                        self.last_out = tail
                        await resp.write(tail)
                # Counted before the final chunk: a client that has seen the end finds it in /metrics.
                self.wait_ns += wait
                wait = 0
                self._record(self.t_last, status, None)
                await resp.write_eof()
            except ConnectionResetError:
                raise _ClientGone from None
        except asyncio.CancelledError:
            self.wait_ns += wait
            if wd.fired is None:  # client went away (or hard shutdown): abort upstream, re-raise
                self._record(self.t_last, status, self._cancel_reason())
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return await self._fail_late(resp, wd.fired, self.t_last, status)
        except _ClientGone:
            self.wait_ns += wait
            self._record(self.t_last, status, "client_disconnect")
            return resp
        except UpstreamError:
            self.wait_ns += wait
            return await self._fail_late(resp, "reset", self.t_last, status)
        self.wait_ns += wait
        self._record(self.t_last, status, None)
        return resp

    # ------------------------------------------------------------------ failures
    def _cancel_reason(self) -> str:
        return "shutdown" if self.relay.stopping else "client_disconnect"

    def _fail_early(self, code: str, detail: str | None) -> web.Response:
        """Nothing was sent to the client yet: an OpenAI-style JSON error."""
        self._record(None, status_of(code), code)
        return json_error(code, detail)

    async def _fail_late(self, resp: web.StreamResponse, code: str, t_last: int, status: int) -> web.StreamResponse:
        """Headers (and maybe chunks) already went out: an SSE error event + [DONE], or a cut connection."""
        if self.conn is not None:
            self.conn.abort()
        self._record(t_last, status, code)
        obs_stream = self.obs is not None and self.obs.stream
        if obs_stream or resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            last = self.last_out
            clean = last.endswith(b"\n\n") or last.endswith(b"\r\n\r\n") or last.endswith(b"\r\r")
            try:
                await resp.write(sse_error(code, new_event=clean))
                await resp.write_eof()
            except (ConnectionResetError, RuntimeError, asyncio.CancelledError):
                pass  # client gone, or the stream had just ended (write after EOF)
            return resp
        resp.force_close()  # a non-SSE body cannot carry an error: cut it so the client sees a failure
        transport = self.request.transport
        if transport is not None:
            transport.abort()
        return resp

    # ------------------------------------------------------------------ record
    def _record(self, t_last: int | None, status: int, error: str | None) -> None:
        if self.outcome == OTHER:
            self.outcome = outcome_of(status, error, started=self.resp is not None)
        info = self.info
        if info is None:
            return
        t_end = perf_counter_ns()
        obs = self.obs
        if obs is None:
            obs = self.obs = StreamObserver(self.t0, stream=False, endpoint=info.endpoint)
        t_done = t_last if t_last is not None else t_end
        if error in ("client_disconnect", "shutdown") and obs.stream:
            # A client that hangs up after [DONE] / the finish chunk got the whole answer.
            record: RequestRecord = obs.finish(t_done, status=status)
            if record.error == "incomplete_stream":
                record.error = error
        else:
            record = obs.finish(t_done, status=status, error=error)
        record.t = (self.t0 - self.relay.start_ns) * NS
        record.model = info.model
        record.stream = info.stream
        record.max_tokens = info.max_tokens
        if record.input_tokens is None and info.prompt_chars:
            # no usage (llama.cpp streams, failed requests): bytes/4 keeps the request replayable
            record.input_tokens = info.est_input_tokens
            record.input_estimated = True
        record.upstream = self.upstream.name
        router = self.relay.router
        if router.several_pools:
            record.pool = self.lease.pool
        if router.admission:
            record.queue = self.lease.queue_s
        if record.error is None:
            self.ttft, self.tpot = record.ttft, record.tpot
        if record.n_inputs is None:
            record.n_inputs = info.n_inputs
        busy = (t_end - self.t_body) - self.wait_ns + self.sink_ns
        record.overhead = max(0, busy) * NS
        self.info = None  # record once
        try:
            self.relay.recorder.finish(record, self.parsed)
        except Exception:  # metrics must never break the relay
            log.exception("recording a request failed")
