"""One ext_proc stream = one HTTP request through Envoy: pick the endpoint, then observe the response.

Request headers and body (full-duplex streamed: the whole body arrives before the EPP answers the
headers) → the OpenAI body parsed once, the gateway's router picks an endpoint (or answers 429/503
at once); response headers and body chunks → the gateway's StreamObserver, whose output (the
injected usage chunk stripped) is the body Envoy forwards; the end (or Envoy's reset) → the
gateway's record assembly and recorder. Never decodes JSON per chunk, never logs per request.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import Any, Protocol

import orjson

from slogate.gateway import assemble
from slogate.gateway.body_budget import BodyBudget
from slogate.gateway.config import is_trusted
from slogate.gateway.epp import messages as m
from slogate.gateway.errors import json_error
from slogate.gateway.headers import CONTROL_PREFIX
from slogate.gateway.recorder import Recorder
from slogate.gateway.routing.admission import Closed, Rejected, parse_priority, rejection_response
from slogate.gateway.routing.health import OTHER, outcome_of
from slogate.gateway.routing.router import Router, RouteRequest
from slogate.gateway.routing.upstreams import Lease, host_port
from slogate.traces.observer import StreamObserver
from slogate.traces.record import ErrorClass
from slogate.traces.request_info import MEASURED_ENDPOINTS, RequestInfo, request_info, with_usage_requested

_USAGE_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})  # stream_options exists there
_NO_ENDPOINT = orjson.dumps({"error": {"message": "the endpoint picker has no endpoint for this pool",
                                       "type": "service_unavailable", "param": None, "code": "no_endpoint"}})
# Envoy's router adds this header to every response an endpoint sent; its local replies (it could not
# connect, or the endpoint reset before the head) lack it, and their body names the reason.
_UPSTREAM_TIME = "x-envoy-upstream-service-time"
_CONNECT_FAILURE = b"connection failure"
Responses = list[bytes]  # encoded ProcessingResponse messages


class Parts(Protocol):
    """What an EPP exchange reads of the process-wide state (gateway.server.Gateway)."""

    router: Router
    recorder: Recorder
    start_ns: int
    empty: bool  # no endpoint at all (an empty endpoints file): answer 503
    stopping: bool  # the shutdown grace is over: streams cut now were cut by the shutdown
    max_body: int  # --max-body-bytes: a larger request body is answered 413
    budget: BodyBudget  # --max-inflight-body-bytes: request-body bytes the EPP holds at once


class EppExchange:
    """State of one ext_proc stream (see the module docstring)."""

    __slots__ = ("answered", "body", "body_held", "busy_ns", "drop", "headers", "info", "inject", "lease",
                 "local_error", "obs", "outcome", "parsed", "parts", "path", "priority_header", "route", "router",
                 "seen", "sse_answer", "status", "strip", "t0", "t_last", "tpot", "trusted", "ttft")

    def __init__(self, parts: Parts, *, inject_usage: bool, priority_header: str, trusted: list) -> None:
        self.parts = parts
        self.inject = inject_usage
        self.priority_header = priority_header
        self.trusted = trusted  # --trust-header-from: the networks whose x-slogate-* headers count
        self.drop: list[str] = []  # x-slogate-* headers of an untrusted client: removed before Envoy forwards
        self.t0 = 0
        self.t_last = 0
        self.busy_ns = 0  # EPP time spent on this request's messages (the record's `overhead`)
        self.headers: dict[str, str] = {}
        self.path = ""
        self.body: list[bytes] = []
        self.body_held = 0  # request-body bytes held, taken from the process-wide body budget
        self.answered = False  # answered with an immediate response: later messages are ignored
        self.parsed: Any = None
        self.info: RequestInfo | None = None  # None once recorded (or for unmeasured paths)
        self.strip = False  # include_usage was injected: its usage-only chunk is removed from the answer
        self.route: RouteRequest | None = None
        self.router: Router | None = None  # the one the lease is from (the endpoints file may replace it)
        self.lease: Lease | None = None
        self.obs: StreamObserver | None = None
        self.status = 0
        self.local_error: ErrorClass | None = None  # Envoy answered itself: it could not reach the endpoint
        self.sse_answer: bool | None = None  # the 2xx answer was an event stream (None: no 2xx answer)
        self.seen = 0  # output chunks already drawn from the lease
        self.outcome = OTHER
        self.ttft: float | None = None
        self.tpot: float | None = None

    async def on_message(self, req: m.Incoming) -> Responses:
        t = perf_counter_ns()
        try:
            return await self._dispatch(req, t)
        finally:
            self.busy_ns += perf_counter_ns() - t

    async def _dispatch(self, req: m.Incoming, t: int) -> Responses:
        kind = req.kind
        if kind == "response_body":  # the hot path: one per response chunk
            return self._response_body(req.body, req.end_of_stream, t)
        if self.answered:  # Envoy answered the client for the EPP: what it still sends goes nowhere
            return []
        if kind == "request_headers":
            return await self._request_headers(req, t)
        if kind == "request_body":
            refusal = self._hold(req.body)
            if refusal is not None:
                return refusal
            if not req.end_of_stream:
                return []
            return await self._route(t, body_end=True)
        if kind == "response_headers":
            return self._response_headers(req, t)
        if kind == "request_trailers":  # the body ended with trailers: route now
            out = await self._route(t, body_end=False) if self.route is None else []
            return [*out, m.request_trailers()]
        if kind == "response_trailers":
            tail = self.obs.flush() if self.obs is not None else b""
            out = [m.response_body(tail, False)] if tail else []
            self.record(t, None)
            return [*out, m.response_trailers()]
        return []

    # ------------------------------------------------------------------ the request: pick an endpoint
    async def _request_headers(self, msg: m.Incoming, t: int) -> Responses:
        self.t0 = t
        self.headers = headers = msg.headers or {}
        control = [k for k in headers if k.startswith(CONTROL_PREFIX)]
        if control and not is_trusted(msg.source, self.trusted):  # as the gateway: no effect, never forwarded
            for k in control:
                del headers[k]
            self.drop = control
        self.path = self.headers.get(":path", "/").split("?", 1)[0]
        if msg.end_of_stream:  # no body (GET /v1/models, ...): route on the headers alone
            return await self._route(t, body_end=None)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.parts.max_body:  # as the gateway: refused before the body
            return self._too_large(int(length))
        return []  # full duplex: answered once the whole body is here

    # ------------------------------------------------------------------ the request body: bounded
    def _hold(self, data: bytes) -> Responses | None:
        """Keep a request-body chunk until the body is complete; the refusal when the body outgrows
        --max-body-bytes (413) or the process-wide --max-inflight-body-bytes budget (503)."""
        n = len(data)
        if self.body_held + n > self.parts.max_body:
            return self._too_large(-1)
        if not self.parts.budget.take(n):
            self._release_body()
            self.answered = True
            return [m.immediate(503, self.parts.budget.refusal_body(), (("Retry-After", "1"),),
                                details="slogate_epp_body_budget")]
        self.body_held += n
        self.body.append(data)
        return None

    def _release_body(self) -> None:
        self.body = []
        if self.body_held:
            self.parts.budget.give(self.body_held)
            self.body_held = 0

    def _too_large(self, length: int) -> Responses:
        """413 `request_too_large` (the gateway's answer and record); `length` as announced, -1 when
        the body grew past the limit."""
        self._release_body()
        self.answered = True
        self.parts.budget.too_large()
        if self.headers.get(":method") == "POST" and self.path in MEASURED_ENDPOINTS:
            assemble.record_too_large(self.parts.recorder, t0_ns=self.t0, start_ns=self.parts.start_ns,
                                      endpoint=self.path)
        detail = assemble.too_large_detail(self.parts.max_body, length) + "; raise --max-body-bytes"
        reply = json_error("request_too_large", detail)
        return [m.immediate(reply.status, reply.body, details="slogate_epp_request_too_large")]

    async def _route(self, t: int, *, body_end: bool | None) -> Responses:
        """`body_end`: True when the body ended with its last chunk, False when with trailers, None
        when the request has no body."""
        body = b"".join(self.body)
        self._release_body()  # handed to Envoy with the answer below
        send = body
        headers = self.headers
        info: RequestInfo | None = None
        if headers.get(":method") == "POST" and self.path in MEASURED_ENDPOINTS:
            try:
                self.parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                self.parsed = None  # forwarded unchanged: the endpoint answers (400) and it is recorded
            info = request_info(self.path, self.parsed)
            if info.stream and not info.include_usage and self.inject and self.path in _USAGE_ENDPOINTS:
                send = with_usage_requested(self.parsed)
                self.strip = True
        self.info = info
        if self.parts.empty:
            self._record_unsent(503, "rejected", None, None)
            return [m.immediate(503, _NO_ENDPOINT, details="slogate_epp_no_endpoint")]
        try:
            self.lease = lease = await self._acquire(info, headers)
        except Rejected as rejected:
            self._record_unsent(429, "rejected", rejected.pool, rejected.queue_s)
            reply = rejection_response(rejected)
            return [m.immediate(reply.status, reply.body, reply.headers, details="slogate_epp_rejected")]
        except Closed as closed:  # the shutdown grace ended while it waited
            self._record_unsent(503, "shutdown", closed.pool, closed.queue_s)
            reply = json_error("shutdown")
            return [m.immediate(reply.status, reply.body, (("Retry-After", "1"),), details="slogate_epp_shutdown")]
        except asyncio.CancelledError:  # Envoy reset the stream while the request was queued
            route = self.route
            assert route is not None
            self._record_unsent(499, "shutdown" if self.parts.stopping else "client_disconnect", route.pool,
                                route.queue_s)
            raise
        self.busy_ns -= int(lease.queue_s * 1e9)  # waiting in the admission queue is not EPP work
        endpoint = host_port(lease.upstream.spec.url)
        if self.strip:  # the body grew: its length, and an identity stream so the usage chunk can be cut
            out = [m.route_to(endpoint, set_headers=[("content-length", str(len(send)))],
                              remove=[*self.drop, "accept-encoding"])]
        else:
            out = [m.route_to(endpoint, remove=self.drop)]
        if body_end is not None:
            out.append(m.request_body(send, body_end))
        return out

    async def _acquire(self, info: RequestInfo | None, headers: dict[str, str]) -> Lease:
        """A lease from the current router. A new endpoint list replaces the router and closes the old
        one's admission queue: a request waiting there waits again in the new one (its time counted)."""
        waited = 0.0
        while True:
            self.router = router = self.parts.router
            priority = parse_priority(headers.get(self.priority_header)) if router.admission else 0
            self.route = route = router.request(info, self.parsed, priority)
            try:
                lease = await router.acquire(route)
            except (Rejected, Closed) as exc:
                exc.queue_s += waited
                if isinstance(exc, Closed) and self.parts.router is not router and not self.parts.stopping:
                    waited = exc.queue_s
                    continue
                raise
            except asyncio.CancelledError:
                route.queue_s += waited
                raise
            lease.queue_s += waited
            return lease

    def _record_unsent(self, status: int, error: ErrorClass, pool: str | None, queue_s: float | None) -> None:
        info, self.info = self.info, None
        if info is None:
            return
        record = assemble.unsent_record(info, t0_ns=self.t0, start_ns=self.parts.start_ns, t_end=perf_counter_ns(),
                                        status=status, error=error, pool=pool, queue=queue_s)
        assemble.hand_off(self.parts.recorder, record, None)

    # ------------------------------------------------------------------ the response: observe it
    def _response_headers(self, msg: m.Incoming, t: int) -> Responses:
        headers = msg.headers or {}
        try:
            self.status = status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = status = 0
        sse = headers.get("content-type", "").startswith("text/event-stream")
        is_sse = 200 <= status < 300 and sse
        encoded = headers.get("content-encoding", "identity").lower() not in ("identity", "")
        strip = self.strip and is_sse and not encoded
        self.strip = strip
        if status >= 500 and _UPSTREAM_TIME not in headers:  # Envoy's own reply: no endpoint answered
            self.local_error = "reset"  # made "connect" when its body names a connection failure
        info = self.info
        if info is not None:
            self.obs = StreamObserver(self.t0, stream=is_sse and not encoded, endpoint=info.endpoint,
                                      strip_usage=strip, keep_chunk_times=True, n_inputs=info.n_inputs)
            self.sse_answer = is_sse if 200 <= status < 300 else None
        out = [m.response_headers(remove=["content-length"] if strip else ())]
        if msg.end_of_stream:
            self.record(t, self.local_error)
        return out

    def _response_body(self, data: bytes, end: bool, t: int) -> Responses:
        self.t_last = t
        if self.local_error is not None and _CONNECT_FAILURE in data:
            self.local_error = "connect"
        obs = self.obs
        if obs is not None:
            done_before = obs.done
            data = obs.feed(data, t) if data else b""
            if done_before:
                data = b""  # after [DONE]: counted by the observer, never forwarded (as in the gateway)
            n = obs.output_chunks
            if n != self.seen and self.lease is not None:
                self.lease.on_tokens(n - self.seen)  # draw down the in-flight token estimate
                self.seen = n
            if end:
                tail = obs.flush()
                if tail:
                    data += tail
        if end:
            self.record(t, self.local_error)
        return [m.response_body(data, end)]

    # ------------------------------------------------------------------ the end: one record
    def close(self) -> None:
        """The ext_proc stream ended: a request not yet recorded was cut (Envoy's reset: the client left
        or the endpoint broke; the protocol does not say which, so it is not held against the endpoint;
        or the EPP's shutdown grace ended)."""
        self._release_body()
        if self.info is not None and self.lease is not None:
            self.record(None, "shutdown" if self.parts.stopping else "client_disconnect")
        lease, self.lease = self.lease, None
        if lease is not None and self.router is not None:
            self.router.release(lease, self.outcome, self.ttft, self.tpot)

    def record(self, t_last: int | None, error: ErrorClass | None) -> None:
        """Record the request once (later calls only keep the first health outcome)."""
        status = self.status
        if self.outcome == OTHER:
            self.outcome = outcome_of(status, error, started=self.obs is not None and self.obs.got_bytes)
        info, self.info = self.info, None
        if info is None or self.lease is None:
            return
        t_end = perf_counter_ns()
        obs = self.obs
        if obs is None:
            obs = self.obs = StreamObserver(self.t0, stream=False, endpoint=info.endpoint)
        router = self.router
        lease = self.lease
        assert router is not None
        record = assemble.exchange_record(
            obs, info, t0_ns=self.t0, start_ns=self.parts.start_ns,
            t_done=t_last if t_last is not None else (self.t_last or t_end),
            status=status, error=error, upstream=lease.upstream.name,
            pool=lease.pool if router.several_pools else None,
            queue=lease.queue_s if router.admission else None,
            overhead_ns=self.busy_ns, answered_stream=self.sse_answer,
        )
        if record.error is None:
            self.ttft, self.tpot = record.ttft, record.tpot
        assemble.hand_off(self.parts.recorder, record, self.parsed, self.headers)
