"""Relay: the gateway's handler for every proxied path. Admits the request and hands it to an `Exchange`.

Gets the whole body from the server (gateway.http_server), parses JSON once (orjson) for LLM endpoints only, asks the router for an
upstream (waiting in the admission queue when limits are set) and records requests that never
reached one (413, 429, the client left the queue). The exchange itself (attempts, streaming,
failures, its record) is gateway.exchange. Never decodes JSON per chunk, never logs per request.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import Any

import orjson

from slogate.gateway import assemble
from slogate.gateway.config import GatewayConfig
from slogate.gateway.errors import json_error
from slogate.gateway.exchange import Exchange
from slogate.gateway.http_server import ClientRequest
from slogate.gateway.recorder import Recorder
from slogate.gateway.routing.admission import Closed, Rejected, parse_priority, rejection_response
from slogate.gateway.routing.router import Router
from slogate.gateway.timeouts import Deadlines, Watchdog, limits_ns
from slogate.traces.record import ErrorClass
from slogate.traces.request_info import MEASURED_ENDPOINTS, RequestInfo, request_info, with_usage_requested

_USAGE_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})  # stream_options exists there


class Relay:
    """The handler for every proxied path."""

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
        # the decoded body outlives routing only for the trace's prefix hashes or the tokenizer
        self.keep_parsed = recorder.capture is not None or recorder.tokens is not None
        self.stopping = False  # set on SIGTERM
        self.propagate = False  # --otel: send the gateway span's traceparent upstream (gateway/trace_context.py)
        self.active: set[Watchdog] = set()  # one per request in flight (ended at the grace deadline)

    async def handle(self, request: ClientRequest) -> None:
        t0 = request.t0
        path = request.path
        measured = request.method == "POST" and path in MEASURED_ENDPOINTS
        if request.too_large is not None:
            return self._too_large(request, t0, path, measured, request.too_large)
        t_body = request.t_body
        body = request.body
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
                request.body = body = b""  # the rewritten body replaces it: held once
                strip = True
        router = self.router
        priority = parse_priority(request.headers.get(self.priority_header)) if router.admission else 0
        route = router.request(info, parsed, priority)
        try:
            lease = await router.acquire(route)  # waits only when admission limits are set
        except Rejected as rejected:
            self._record_unsent(t0, info, 429, "rejected", rejected.pool, rejected.queue_s)  # why: in the body
            return request.conn.reply(rejection_response(rejected))
        except Closed as closed:  # the shutdown deadline passed while it waited
            self._record_unsent(t0, info, 503, "shutdown", closed.pool, closed.queue_s)
            return request.conn.reply(json_error("shutdown"))
        except asyncio.CancelledError:  # the client hung up while queued: record it, then unwind
            self._record_unsent(t0, info, 499, "shutdown" if self.stopping else "client_disconnect",
                                route.pool, route.queue_s)
            raise
        # the gateway's own time starts when the request is admitted: a wait in the admission queue is not overhead
        t_admitted = t_body + round(lease.queue_s * 1e9) if lease.queue_s else t_body
        exchange = Exchange(self, request, route, lease, info, parsed if self.keep_parsed else None, send, strip,
                            t0, t_admitted)
        del body, send, parsed  # the exchange holds the body until the upstream has it, then drops it
        await exchange.run()

    def _record_unsent(self, t0: int, info: RequestInfo | None, status: int, error: ErrorClass, pool: str | None,
                       queue_s: float | None) -> None:
        """A measured request that never reached an upstream (admission 429, or the client left the
        queue): recorded with its queue time; it counts against SLO attainment."""
        if info is None:
            return
        record = assemble.unsent_record(info, t0_ns=t0, start_ns=self.start_ns, t_end=perf_counter_ns(),
                                        status=status, error=error, pool=pool, queue=queue_s)
        assemble.hand_off(self.recorder, record, None)

    def expire_all(self, reason: str = "shutdown") -> int:
        """End every request in flight (JSON error before the first byte, error event + [DONE] after),
        and every one still waiting for admission (503 `shutdown`)."""
        for wd in list(self.active):
            wd.expire(reason)
        return len(self.active) + self.router.close_admission()

    def _too_large(self, request: ClientRequest, t0: int, path: str, measured: bool, length: int) -> None:
        if measured:
            assemble.record_too_large(self.recorder, t0_ns=t0, start_ns=self.start_ns, endpoint=path)
        request.conn.reply(json_error("request_too_large", assemble.too_large_detail(self.max_body, length),
                                      close=True))  # the body stays unread
