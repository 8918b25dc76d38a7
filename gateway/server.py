"""Accept: the gateway process — listeners, startup, admin endpoints and graceful shutdown.

Builds the parts (upstream connection pools, router, relay, live metrics, status window, capture), serves
the proxy on `listen` (with `/healthz`, `/readyz`) and `/metrics` + `/slogate/status` on `admin_listen`
(default 127.0.0.1 on the proxy port + 1; on `listen` only with `admin_listen = "proxy"`).
SIGTERM/SIGINT: stop accepting, let in-flight streams finish within `shutdown_grace`, then close the
pools and flush the trace. Never handles a request body itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import signal
from collections.abc import Awaitable, Callable

import msgspec
import orjson

from slogate.gateway import http_server
from slogate.gateway.body_budget import BodyBudget
from slogate.gateway.capture import Capture, perf_epoch
from slogate.gateway.client_limits import ClientLimits, connection_cap
from slogate.gateway.config import (
    GatewayConfig,
    admin_address,
    is_trusted,
    known_models,
    parse_hostport,
    parse_slos,
    trusted_networks,
    upstream_specs,
)
from slogate.gateway.http_server import ClientConn, ClientRequest, Reply
from slogate.gateway.live_metrics import LiveMetrics, MetricsCollector, make_registry, render, watch_loop_lag
from slogate.gateway.model_list import watch_models
from slogate.gateway.recorder import Recorder, Sink
from slogate.gateway.relay import Relay
from slogate.gateway.routing.router import Router
from slogate.gateway.status import StatusWindow, health_response
from slogate.gateway.timeouts import Deadlines
from slogate.gateway.tokens import GatewayTokens
from slogate.gateway.upstream import Upstream
from slogate.gateway.worker_admin import WORKER_STATUS_PATH, worker_status_endpoint
from slogate.gateway.worker_role import WorkerRole
from slogate.traces.fdtable import reserve_fds
from slogate.traces.runtime import shorten_switch_interval

log = logging.getLogger("slogate.gateway")
Endpoint = Callable[[], Awaitable[Reply]]
_NOT_FOUND = Reply(404, b'{"error":"not found"}')
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def config_digest(cfg: GatewayConfig) -> str:
    return "b2:" + hashlib.blake2b(msgspec.json.encode(cfg), digest_size=8).hexdigest()


class Gateway:
    """All long-lived parts of one gateway process."""

    def __init__(self, cfg: GatewayConfig, role: WorkerRole | None = None) -> None:
        self.cfg = cfg
        self.role = role  # --workers N: this process is one worker (gateway/workers.py); None: the only one
        slos = parse_slos(cfg.slos)
        self.start_ns, self.start_unix = perf_epoch() if role is None else (role.start_ns, role.start_unix)
        self.router = Router(upstream_specs(cfg), cfg.routing, expected_output_tokens=cfg.expected_output_tokens,
                             shared=None if role is None else role.shared(cfg))
        self.upstreams: list[Upstream] = []
        for state in self.router.states:  # the router keeps the load; the Upstream owns the connections
            state.target = Upstream(state.spec.url, state.name)
            self.upstreams.append(state.target)
        self.metrics = LiveMetrics([s.name for s in slos], max_models=cfg.max_model_labels,
                                   known_models=known_models(cfg), provider=cfg.provider_name,
                                   legacy_model_label=cfg.legacy_model_label)
        self.status = StatusWindow(slos, self.start_ns)
        self.capture = (
            Capture(cfg, start_ns=self.start_ns, start_unix=self.start_unix, config_digest=config_digest(cfg),
                    prefix="slogate" if role is None else role.trace_prefix)
            if cfg.trace.dir else None
        )
        self.sinks = _sinks(cfg, self.start_unix)
        self.recorder = Recorder(slos, self.metrics, self.status, self.capture, self.start_ns, self.sinks)
        if cfg.tokens.tokenizer:  # exact input tokens when upstreams send no usage (gateway/tokens.py)
            self.recorder.tokens = GatewayTokens(cfg.tokens.tokenizer, cfg.tokens.template)
        self.deadlines = Deadlines()
        self.relay = Relay(cfg, self.router, self.recorder, self.start_ns, self.deadlines)
        self.relay.propagate = cfg.otel  # the gateway's span is the parent of the engine's (trace_context.py)
        self.registry = make_registry(MetricsCollector(self.metrics, self._inflight, self.recorder.trace_counts))
        self.routing_collector = self.router.collector()  # kept: the EPP re-points it when its endpoints change
        self.registry.register(self.routing_collector)
        self.body_budget = BodyBudget(cfg.max_inflight_body_bytes)  # the proxy port's (gateway.body_budget)
        self.registry.register(self.body_budget.collector())
        if cfg.otel:  # the same families over OTLP (gateway/otel_metrics.py); a lifecycle sink: the recorder
            self.sinks.append(_otel_metrics(self.registry, self.start_unix))  # holds its own tuple, never calls it
        self.admin: dict[str, Endpoint] = {
            "/metrics": self.metrics_endpoint,
            "/slogate/status": self.status_endpoint,
            "/healthz": self.healthz,
            "/readyz": self.readyz,
        }
        if role is not None:  # the supervisor merges every worker's status (gateway/admin_merge.py)
            self.admin[WORKER_STATUS_PATH] = worker_status_endpoint(self)
        self._tasks: list[asyncio.Task] = []

    def _inflight(self) -> list[tuple[str, int, int]]:
        return [(name, n_req, max(0, n_tok)) for name, n_req, n_tok in self.router.inflight()]

    # ------------------------------------------------------------------ admin endpoints
    async def metrics_endpoint(self) -> Reply:
        return Reply(200, render(self.registry), METRICS_CONTENT_TYPE)

    async def status_endpoint(self) -> Reply:
        # Percentiles over up to 5 minutes of requests: computed in a thread on a copy, so a large
        # window never stalls the relay for long (the copy itself is a fast C-level list()).
        rows, now = list(self.status.rows), self.status.now()
        snap = await asyncio.to_thread(self.status.snapshot, rows, now)
        snap |= self.status_extras()
        return Reply(200, orjson.dumps(snap))

    def status_extras(self) -> dict:
        """The parts of /slogate/status besides the windows: upstreams, routing, trace, loop lag."""
        written, dropped = self.recorder.trace_counts()
        return {
            "upstreams": {
                s.name: {"inflight_requests": s.inflight_requests, "inflight_tokens": max(0, s.inflight_tokens),
                         "ready": s.target.ready}  # type: ignore[attr-defined]
                for s in self.router.states
            },
            "routing": self.router.status(),
            "trace": {"enabled": self.capture is not None, "written": written, "dropped": dropped},
            "event_loop_lag_s": self.metrics.loop_lag,
        }

    async def healthz(self) -> Reply:
        return Reply(*health_response(True))

    async def readyz(self) -> Reply:
        return Reply(*health_response(any(u.ready for u in self.upstreams) and self.router.ready()
                                      and self.status.answering(self.cfg.unready_after_errors)))

    # ------------------------------------------------------------------ request entry points
    def proxy_handler(self, *, with_admin: bool) -> http_server.Handler:
        admin = self.admin if with_admin else {"/healthz": self.healthz, "/readyz": self.readyz}
        relay = self.relay.handle
        trusted = trusted_networks(self.cfg.trust_header_from)
        # a body over the budget: 503, and the connection closes (its body is left unread)
        refusal = Reply(503, self.body_budget.refusal_body(), headers=(("Retry-After", "1"),), close=True)

        async def handle(request: ClientRequest) -> None:
            if request.refused:
                return request.conn.reply(refusal)
            if request.method == "GET":
                endpoint = admin.get(request.path)
                if endpoint is not None:
                    return request.conn.reply(await endpoint())
            if request.headers.control and not is_trusted(request.remote, trusted):
                request.headers = request.headers.without_control()
            await relay(request)

        return handle

    async def admin_handler(self, request: ClientRequest) -> None:
        endpoint = self.admin.get(request.path) if request.method in ("GET", "HEAD") else None
        request.conn.reply(_NOT_FOUND if endpoint is None else await endpoint())

    # ------------------------------------------------------------------ lifecycle
    async def startup(self) -> None:
        for u in self.upstreams:
            await u.start(self.cfg.timeouts, self.cfg.max_connections_per_upstream)
        if self.capture is not None:
            self.capture.start()
        self.deadlines.start()
        if self.recorder.tokens is not None:
            self.recorder.tokens.start()
        for sink in self.sinks:
            sink.start()
        await self.router.start()
        self._tasks.append(asyncio.create_task(watch_loop_lag(self.metrics, self.cfg.loop_lag_interval)))
        if self.metrics.known_models is None:  # model labels bounded to what the upstreams list
            urls = [s.spec.url for s in self.router.states]
            self._tasks.append(asyncio.create_task(watch_models(urls, self.metrics.list_models)))

    async def close(self) -> None:
        await self.deadlines.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.router.close()
        for u in self.upstreams:
            await u.close()
        if self.recorder.tokens is not None:
            await self.recorder.tokens.close()  # records still queued go to the capture as estimated
        if self.capture is not None:
            self.capture.stop_watching()
            await asyncio.to_thread(self.capture.close)
        await asyncio.gather(*(sink.close() for sink in self.sinks))  # side by side: OTLP's each take up to 5 s


def _sinks(cfg: GatewayConfig, start_unix: float) -> list[Sink]:
    """The optional per-request sinks: access log and OpenTelemetry spans."""
    sinks: list[Sink] = []
    if cfg.access_log is not None:
        from slogate.gateway.access_log import AccessLog

        sinks.append(AccessLog(cfg.access_log, start_unix))
    if cfg.otel:
        from slogate.gateway.otel import OtelSpans

        sinks.append(OtelSpans(start_unix, cfg.provider_name))
    return sinks


def _otel_metrics(registry, start_unix: float) -> Sink:  # type: ignore[no-untyped-def]
    from slogate.gateway.otel_metrics import OtelMetrics

    return OtelMetrics(registry, start_unix)


def client_limits(cfg: GatewayConfig) -> ClientLimits:
    c = cfg.client
    return ClientLimits(header=c.header_timeout, body=c.body_timeout, body_min_rate=c.body_min_rate,
                        idle=c.keepalive_timeout, cap=connection_cap(c.max_connections))


def _tune_runtime() -> None:
    """Latency tails: everything built at startup leaves the cyclic GC's view (a full collection of it
    stalls the loop ~10 ms), the trace writer thread hands the GIL back to the loop within 0.5 ms
    (the default switch interval lets it hold the loop off for 5 ms), and the fd table is grown
    before the first connection (each kernel growth stalls accept() 5–15 ms)."""
    reserve_fds()
    gc.collect()
    gc.freeze()
    shorten_switch_interval()


def _end_remaining(relay: Relay) -> None:
    n = relay.expire_all("shutdown")
    if n:
        log.warning("grace period over: ended %d in-flight requests", n)


def stop_on_signals(stop: asyncio.Event | None) -> asyncio.Event:
    """`stop` (or a new event), set by SIGTERM or SIGINT on the running loop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def serve(cfg: GatewayConfig, *, stop: asyncio.Event | None = None, role: WorkerRole | None = None) -> None:
    """Run the gateway until `stop` is set (or SIGTERM/SIGINT). With a `role` (one of `--workers N`)
    the proxy port is shared with the other workers (SO_REUSEPORT) and the admin endpoints are served
    to the supervisor on the role's Unix socket."""
    gateway = Gateway(cfg, role)
    await gateway.startup()
    _tune_runtime()
    stop = stop_on_signals(stop)
    loop = asyncio.get_running_loop()
    limits = client_limits(cfg)  # after _tune_runtime: the cap follows the raised open-files limit
    gateway.registry.register(limits.collector())
    limits.start()
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):  # log rotation
        loop.add_signal_handler(signal.SIGHUP, lambda: [sink.reopen() for sink in gateway.sinks])
    servers: list[tuple[asyncio.Server, set[ClientConn]]] = []
    grace: asyncio.TimerHandle | None = None
    try:
        host, port = parse_hostport(cfg.listen, key="listen")
        admin_at = admin_address(cfg)  # None: on the proxy port (--admin-listen proxy)
        proxy = http_server.Port(gateway.proxy_handler(with_admin=admin_at is None),
                                             max_body=cfg.max_body_bytes, limits=limits, budget=gateway.body_budget)
        if role is not None:  # the supervisor serves admin_listen and asks each worker here
            admin = http_server.Port(gateway.admin_handler, max_body=cfg.max_body_bytes, limits=None)
            servers.append((await http_server.start_unix_server(admin, role.admin_socket), admin.registry))
        elif admin_at is not None:
            admin = http_server.Port(gateway.admin_handler, max_body=cfg.max_body_bytes, limits=None)
            servers.append((await http_server.start_server(admin, *admin_at, backlog=128), admin.registry))
        # the proxy last: once it answers /healthz the admin endpoints answer too; drained first at shutdown
        listener = await http_server.start_server(proxy, host, port, reuse_port=role is not None)
        servers.insert(0, (listener, proxy.registry))
        ups = ", ".join(u.name for u in gateway.upstreams)
        where = (f"admin on {cfg.listen} (--admin-listen proxy)" if admin_at is None and role is None
                 else "admin via the supervisor" if role is not None else f"admin on {admin_at[0]}:{admin_at[1]}")
        trace = f"trace to {cfg.trace.dir}" if cfg.trace.dir else "no trace capture"
        log.info("listening on %s → %s; %s; %s", cfg.listen, ups, where, trace)
        await stop.wait()
        gateway.relay.stopping = True
        log.info("shutting down: stopped accepting, waiting up to %gs for %d in-flight requests",
                 cfg.shutdown_grace, len(gateway.relay.active))
        grace = loop.call_later(cfg.shutdown_grace, _end_remaining, gateway.relay)
    finally:
        for server, conns in servers:  # proxy first (drains streams), admin last
            server.close()
            # the relay ends what is left at `shutdown_grace`; this wait is the backstop behind it
            await http_server.drain(conns, cfg.shutdown_grace + 5.0)
        if grace is not None:
            grace.cancel()
        http_server.log_pending_malformed()
        await limits.stop()
        await gateway.close()
        if gateway.capture is not None:
            written, dropped = gateway.recorder.trace_counts()
            log.info("trace closed: %d records written, %d dropped", written, dropped)
        log.info("stopped")
