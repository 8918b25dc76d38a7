"""Apply a new endpoint list to the EPP: the gateway's router is replaced by one over the new list.

The one apply path of every endpoint source (the endpoints file, the Kubernetes EndpointSlice watch):
counters carry over; an endpoint in both lists keeps its load (its in-flight leases move to the new
router), latency and health view; requests waiting for admission wait again in the new router's queue;
in-flight requests on an endpoint that left finish on the old router; an empty list answers 503. Runs
on the event loop only; a source in another thread hands lists over with `offer_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from slogate.gateway.routing.router import Router
from slogate.gateway.routing.upstreams import Lease, parse_upstream
from slogate.gateway.upstream import Upstream

if TYPE_CHECKING:
    from slogate.gateway.server import Gateway

log = logging.getLogger("slogate.epp")


# What an endpoint in both lists keeps of its UpstreamState besides its load (which moves with its leases).
_CARRIED = ("ttft_ewma", "tpot_ewma", "healthy", "ok_streak", "check_fails", "fail_streak", "ejected_until",
            "backoff_s", "ejections", "scraped_waiting", "scraped_kv_usage", "scraped_at", "last_reason")


class Stream(Protocol):
    """An open ext_proc stream (gateway/epp/exchange.py): the router its lease is from, and the lease."""

    router: Router | None
    lease: Lease | None


class Picker(Protocol):
    empty: bool  # no endpoint: the EPP answers 503
    streams: set  # the open Streams


def carry_over(new: Router, old: Router, streams: Iterable[Stream]) -> None:
    """An endpoint in both routers keeps its view in `new`, and the open leases on it move there: their
    draw-down and release land where the next pick (and the admission limit) looks."""
    for state in new.states:
        was = old.by_name.get(state.name)
        if was is not None:
            for name in _CARRIED:
                setattr(state, name, getattr(was, name))
    for stream in streams:
        lease = stream.lease
        if lease is None or not lease.open or stream.router is new:
            continue
        state = new.by_name.get(lease.upstream.name)
        if state is None:  # its endpoint left the pool: the request finishes on the router it came from
            continue
        held = lease.prompt_tokens + lease.remaining_tokens
        was = lease.upstream
        was.inflight_requests -= 1
        was.inflight_tokens -= held
        state.inflight_requests += 1
        state.inflight_tokens += held
        lease.upstream = state
        stream.router = new


class PoolUpdater:
    """Replaces the gateway's router when an endpoint source reports a different list."""

    def __init__(self, gateway: Gateway, picker: Picker, source: str, current: list[str] | None = None) -> None:
        self.gateway = gateway
        self.picker = picker
        self.source = source  # for the log: "endpoints file", "EndpointSlices of service vllm"
        # the list the gateway started with, as the source gave it
        self.current = [s.spec.url for s in gateway.router.states] if current is None else list(current)
        picker.empty = not self.current
        self._latest: list[str] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def apply(self, urls: list[str]) -> None:
        """Route over `urls` from now on (none: every request is answered 503). A bad URL raises
        UsageError before anything changes."""
        specs = [parse_upstream(u) for u in urls]
        if urls == self.current:
            return
        gw = self.gateway
        if not specs:
            self.picker.empty = True
            self.current = []
            log.warning("%s: no endpoint: answering 503", self.source)
            return
        old = gw.router
        cfg = gw.cfg
        new = Router(specs, cfg.routing, expected_output_tokens=cfg.expected_output_tokens)
        new.metrics = old.metrics  # counters stay monotonic across the change
        kept = {u.name: u for u in gw.upstreams}
        ups: list[Upstream] = []
        for state in new.states:
            u = kept.pop(state.name, None)
            if u is None:
                u = Upstream(state.spec.url, state.name)
                await u.start(cfg.timeouts, cfg.max_connections_per_upstream)
            state.target = u
            ups.append(u)
        c = gw.routing_collector  # /metrics reads the new router's gauges from now on
        c.m, c.queue_depths, c.health = new.metrics, new.queue_depths, new.health_states
        carry_over(new, old, self.picker.streams)  # no await from here to the swap
        gw.router = gw.relay.router = new
        old.close_admission()  # its waiters wait again in the new router's queue (exchange.py)
        gw.upstreams = ups
        self.picker.empty = False
        self.current = list(urls)
        await new.start()
        await old.close()
        for u in kept.values():
            await u.close()
        log.info("%s: endpoints now %s", self.source, ", ".join(s.name for s in new.states))

    # ------------------------------------------------------------------ lists from another thread
    def start(self) -> None:
        """Accept lists from `offer_threadsafe` (applied in order, the latest one wins)."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run())

    def offer_threadsafe(self, urls: list[str]) -> None:
        """Called from any thread: apply `urls` soon on the loop (never waits)."""
        assert self._loop is not None, "start() first"
        self._loop.call_soon_threadsafe(self._offer, list(urls))

    def _offer(self, urls: list[str]) -> None:
        self._latest = urls
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            urls, self._latest = self._latest, None
            if urls is None:
                continue
            try:
                await self.apply(urls)
            except Exception:  # a source's bad list must not end the updates
                log.exception("%s: endpoints not applied", self.source)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
