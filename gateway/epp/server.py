"""Accept: the EPP process — the ext_proc gRPC server, the admin HTTP port, startup and shutdown.

The long-lived parts (router, live metrics, status window, capture, recorder, health checks, engine
metric scraping) are the gateway's own `Gateway` object, so `/metrics`, `/slogate/status` and the trace
are the gateway's. gRPC is served by grpcio's asyncio server on the same loop. Never relays body bytes
itself: Envoy forwards what each `EppExchange` answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from slogate.gateway import http_server
from slogate.gateway.config import GatewayConfig, admin_address, parse_hostport, trusted_networks
from slogate.gateway.epp import messages as m
from slogate.gateway.epp.endpoints import EndpointsFile
from slogate.gateway.epp.exchange import EppExchange
from slogate.gateway.epp.pool import PoolUpdater
from slogate.gateway.routing.router import Router
from slogate.gateway.server import Gateway, _tune_runtime, stop_on_signals

if TYPE_CHECKING:
    from slogate.gateway.epp.kube import SliceWatch

log = logging.getLogger("slogate.epp")
# After the shutdown grace: time for the requests still queued to be answered 503 before the
# streams left are cut.
_LAST_ANSWERS_S = 0.5


class Picker:
    """The ext_proc servicer: one `EppExchange` per gRPC stream."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.inject = gateway.cfg.inject_usage
        self.priority_header = gateway.cfg.routing.priority_header
        self.trusted = trusted_networks(gateway.cfg.trust_header_from)
        self.recorder = gateway.recorder
        self.start_ns = gateway.start_ns
        self.empty = False  # the endpoint source lists none: every request is answered 503
        self.stopping = False  # the shutdown grace is over (streams cut now are recorded as `shutdown`)
        self.max_body = gateway.cfg.max_body_bytes
        self.budget = gateway.body_budget  # the gateway's /metrics families count its refusals
        self.streams: set[EppExchange] = set()  # the ext_proc streams open now (pool.py re-homes their leases)
        self.idle = asyncio.Event()  # set while no stream is open
        self.idle.set()

    @property
    def active(self) -> int:
        return len(self.streams)

    @property
    def router(self) -> Router:  # the gateway's, replaced when the endpoints file changes
        return self.gateway.router

    async def process(self, requests: AsyncIterator[m.Incoming],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        ex = EppExchange(self, inject_usage=self.inject, priority_header=self.priority_header, trusted=self.trusted)
        self.streams.add(ex)
        self.idle.clear()
        try:
            async for req in requests:
                for resp in await ex.on_message(req):
                    yield resp
        finally:
            self.streams.discard(ex)
            if not self.streams:
                self.idle.set()
            ex.close()

    async def drain(self, server: grpc.aio.Server, grace: float) -> None:
        """Stop taking streams, let the open ones finish for up to `grace`; then answer the requests
        still queued 503 `shutdown` and cut the rest (recorded as `shutdown`, as the gateway does)."""
        stopped = asyncio.ensure_future(server.stop(grace + _LAST_ANSWERS_S))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), grace)
        if self.streams:
            log.warning("grace period over: ending %d ext_proc streams", len(self.streams))
        self.stopping = True
        self.router.close_admission()
        await stopped

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.process, request_deserializer=m.decode, response_serializer=None)  # answers are encoded already
        return grpc.method_handlers_generic_handler(m.SERVICE, {m.METHOD: method})


async def serve(cfg: GatewayConfig, *, endpoints_file: str | None = None, kube: SliceWatch | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the EPP until `stop` is set (or SIGTERM/SIGINT): gRPC on `cfg.listen`, admin on `cfg.admin_listen`.
    `kube`: a listed EndpointSlice watch (gateway/epp/kube.py), started here in its thread."""
    gateway = Gateway(cfg)
    await gateway.startup()
    _tune_runtime()
    stop = stop_on_signals(stop)
    picker = Picker(gateway)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 1 << 20)])
    server.add_generic_rpc_handlers((picker.handler(),))
    host, port = parse_hostport(cfg.listen, key="listen")
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(98, f"cannot listen on {cfg.listen}")
    admin_server = None
    watcher = EndpointsFile(endpoints_file, gateway, picker) if endpoints_file else None
    updater = PoolUpdater(gateway, picker, kube.name, current=kube.current) if kube is not None else None
    try:
        await server.start()
        where = admin_address(cfg)  # the CLI refuses "proxy": --listen is gRPC
        if where is not None:
            ahost, aport = where
            admin = http_server.Port(gateway.admin_handler, max_body=cfg.max_body_bytes, limits=None)
            admin_server = (await http_server.start_server(admin, ahost, aport, backlog=128), admin.registry)
        if watcher is not None:
            watcher.start()
        if updater is not None and kube is not None:
            updater.start()
            kube.start(updater.offer_threadsafe)
        ups = ", ".join(s.name for s in gateway.router.states) or "no endpoint yet"
        trace = f"trace to {cfg.trace.dir}" if cfg.trace.dir else "no trace capture"
        log.info("ext_proc on %s → %s; admin on %s:%s; %s", cfg.listen, ups, *(where or ("-", "-")), trace)
        await stop.wait()
        log.info("shutting down: %d ext_proc streams open, up to %gs to finish", picker.active, cfg.shutdown_grace)
    finally:
        if watcher is not None:
            await watcher.stop()
        if updater is not None and kube is not None:
            kube.stop()
            await updater.stop()
        await picker.drain(server, cfg.shutdown_grace)
        if admin_server is not None:
            admin_server[0].close()
            await http_server.drain(admin_server[1], 5.0)
        await gateway.close()
        log.info("stopped")
