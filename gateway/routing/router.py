"""The router: pool → group → policy choice → lease, plus retry decisions, admission and status.

`choose()` is synchronous and O(#upstreams); `acquire()` awaits only in the admission queue.
It never reads response bytes, never holds prompt text (only a 64-bit prefix key) and never
retries a request once a byte of its response went to the client (the relay decides "before").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiohttp

from slogate.gateway.routing import health
from slogate.gateway.routing.admission import AdmissionQueue, Closed, Rejected, retry_after
from slogate.gateway.routing.config import RoutingConfig
from slogate.gateway.routing.metrics import RoutingCollector, RoutingMetrics, bump
from slogate.gateway.routing.policies import Group, PrefixAffinity, make_policy, prefix_key
from slogate.gateway.routing.pools import TokenEstimator, parse_rules, pool_for
from slogate.gateway.routing.scrape import scrape_loop
from slogate.gateway.routing.shared_state import SharedRouting
from slogate.gateway.routing.upstreams import DEFAULT_POOL, Lease, UpstreamSpec, UpstreamState
from slogate.traces.request_info import RequestInfo, prompt_bytes

RETRYABLE = frozenset({health.CONNECT_ERROR, health.HTTP_503, health.RESET_BEFORE_RESPONSE})
MAX_OUTPUT_ESTIMATE = 1 << 24  # tokens: above any model's context; far below the int64 slots of shared_state
_ALL = "*"  # group (and pool label) of every upstream for non-LLM paths (/v1/models, ...); never a pool name
_SKIP_FULL = "skipped: at its in-flight limit"
_SKIP_TRIED = "skipped: already tried for this request"
_SKIP_UNHEALTHY = "skipped: failing active health checks"


class RouteRequest:
    """What the router keeps about one request across attempts."""

    __slots__ = ("attempt", "bypass", "group", "key", "output_tokens", "pool", "priority", "prompt_tokens",
                 "queue_s", "tried")

    def __init__(self, group: Group, prompt_tokens: int, output_tokens: int, key: int | None,
                 priority: int = 0, bypass: bool = False) -> None:
        self.group = group
        self.pool = group.pool
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.key = key
        self.priority = priority
        self.bypass = bypass  # no admission limit (non-LLM paths)
        self.tried: list[UpstreamState] = []
        self.attempt = 0
        self.queue_s = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


class Router:
    def __init__(self, specs: Sequence[UpstreamSpec], cfg: RoutingConfig | None = None, *,
                 expected_output_tokens: int = 256, shared: SharedRouting | None = None) -> None:
        # No specs: only the EPP's, before its endpoint source lists any (its picker answers 503 and
        # never asks); the gateway's config refuses an empty upstream list.
        self.cfg = cfg = cfg or RoutingConfig()
        # --workers N: in-flight counts, ejection and the admission lock shared by all workers (shared_state.py)
        self.shared = shared
        if shared is None:
            self.states = [UpstreamState(s, i, max_requests=cfg.max_inflight_requests,
                                         max_tokens=cfg.max_inflight_tokens) for i, s in enumerate(specs)]
        else:
            self.states = shared.states(list(specs), max_requests=cfg.max_inflight_requests,
                                        max_tokens=cfg.max_inflight_tokens)
        self.by_name = {s.name: s for s in self.states}
        self.rules = parse_rules(cfg.pools)
        self.expected_output_tokens = expected_output_tokens
        self.policy_name = cfg.policy or "least-tokens"
        stale = cfg.scrape_stale_after if cfg.scrape_upstream_metrics else None
        self.policy = make_policy(self.policy_name, seed=cfg.seed, scrape_stale_s=stale,
                                  epsilon=cfg.affinity_epsilon)
        self.uses_prefix_key = isinstance(self.policy, PrefixAffinity)
        self._reason = f"chosen ({self.policy_name}): {self.policy.reason}"
        self._reason_panic = self._reason + " [no healthy upstream in pool: failing open]"
        self.estimator = TokenEstimator(cfg.bytes_per_token, cfg.tokenizer)
        self.metrics = RoutingMetrics()
        self.pools: dict[str, list[UpstreamState]] = {}
        for s in self.states:
            self.pools.setdefault(s.pool, []).append(s)
        self.several_pools = len(self.pools) > 1  # records then carry their pool
        self._zero_counters()
        self.admission = any(s.max_requests or s.max_tokens for s in self.states)  # records carry queue time
        # Another worker's release cannot wake this worker's waiters: they re-check every 5 ms.
        self._claim = shared.claim if shared is not None and self.admission else contextlib.nullcontext
        self._recheck_s = 0.005 if shared is not None else float("inf")
        self._groups: dict[tuple[str, str | None], Group] = {}
        self._groups_of: dict[UpstreamState, list[Group]] = {s: [] for s in self.states}
        self._queues: dict[Group, AdmissionQueue] = {}
        self._model_sets = any(s.models for s in self.states)
        self._multi = len(self.states) > 1  # one upstream: no ejection, the gateway behaves as without routing
        self._all = self._group(_ALL, None, self.states)
        self._tasks: list[asyncio.Task] = []
        self._session: aiohttp.ClientSession | None = None
        self.closed = False  # the shutdown deadline passed: no more leases (close_admission)
        interval = cfg.health.interval
        self.health_interval = (5.0 if len(self.states) > 1 else 0.0) if interval is None else interval

    def _zero_counters(self) -> None:
        """Export every known label set from 0 (Prometheus practice): rate() cannot see the first
        increment of a series that is born with it, and a dashboard shows 0 rather than no data."""
        m = self.metrics
        for pool, members in self.pools.items():
            for reason in ("queue_full", "queue_timeout"):
                m.rejections[(pool, reason)] = 0
            for outcome in sorted(RETRYABLE):
                m.retries[(pool, outcome)] = 0
            for s in members:
                for outcome in sorted(health.FAILURES):
                    m.ejections[(s.name, outcome)] = 0

    # ------------------------------------------------------------------ groups
    def _group(self, pool: str, model: str | None, members: list[UpstreamState]) -> Group:
        group = Group(pool, members)
        self._groups[(pool, model)] = group
        for s in members:
            self._groups_of[s].append(group)
        self._queues[group] = AdmissionQueue(self.cfg.queue_size)
        return group

    def group_for(self, pool: str, model: str | None) -> Group:
        """The pool's upstreams serving `model` (those with no model list serve any model)."""
        if not self._model_sets:
            model = None
        group = self._groups.get((pool, model))
        if group is not None:
            return group
        members = self.pools.get(pool) or self.pools[DEFAULT_POOL]
        if model is not None:
            serving = [s for s in members if model in s.models]
            members = serving or [s for s in members if not s.models] or members
            if len(self._groups) > 4096:  # unknown model names must not grow memory without bound
                return self.group_for(pool, None)
        return self._group(pool, model, members)

    # ---------------------------------------------------------------- requests
    def request(self, info: RequestInfo | None, body: Any = None, priority: int = 0) -> RouteRequest:
        """Plan a request: its pool/group, token estimate and (for affinity) prefix key."""
        if info is None:
            return RouteRequest(self._all, 0, 0, None, priority, bypass=True)
        est = self.estimator
        prompt_tokens = est.count(prompt_bytes(body)) if est.tokenizes else est.prompt_tokens(info.prompt_chars)
        if info.n_inputs is not None:  # embeddings: no output
            output_tokens = 0
        else:
            output_tokens = info.max_tokens if info.max_tokens is not None else self.expected_output_tokens
            # the client's number, bounded: a negative one must not lower an upstream's load, and 2**63 must
            # not overflow the shared in-flight slots of --workers (the upstream answers it with a 400)
            output_tokens = min(max(output_tokens, 0), MAX_OUTPUT_ESTIMATE)
        pool = pool_for(self.rules, prompt_tokens, output_tokens) if self.rules else DEFAULT_POOL
        group = self.group_for(pool, info.model)
        key = prefix_key(prompt_bytes(body), self.cfg.affinity_prefix_bytes) if self.uses_prefix_key else None
        return RouteRequest(group, prompt_tokens, output_tokens, key, priority)

    def choose(self, req: RouteRequest, exclude: Sequence[UpstreamState] = ()) -> UpstreamState | None:
        """The upstream for this attempt, or None when every usable member is at its limit."""
        now = time.monotonic()
        group = req.group
        tokens = req.tokens
        bypass = req.bypass
        ok: list[UpstreamState] = []
        full = False
        for s in group.members:
            if exclude and s in exclude:
                s.last_reason = _SKIP_TRIED
            elif not s.healthy:
                s.last_reason = _SKIP_UNHEALTHY
            elif now < s.ejected_until:
                s.last_reason = f"skipped: ejected after failures ({s.ejected_until - now:.1f}s left)"
            elif not bypass and not s.has_room(tokens):
                s.last_reason = _SKIP_FULL
                full = True
            else:
                ok.append(s)
        panic = False
        if not ok:
            if full:
                return None
            # No healthy member: fail open rather than refuse (a single upstream behaves as before).
            ok = [s for s in group.members if s not in exclude and (bypass or s.has_room(tokens))]
            if not ok:
                return None
            panic = True
        chosen = ok[0] if len(ok) == 1 else self.policy.choose(group, ok, req.key, tokens, now)
        chosen.last_reason = self._reason_panic if panic else self._reason
        bump(self.metrics.decisions, (chosen.name, group.pool, self.policy_name))
        return chosen

    async def acquire(self, req: RouteRequest) -> Lease:
        """A lease on an upstream, waiting in the group's admission queue when all are full.

        Raises `Rejected` (answer 429) when the queue is full or the wait times out, `Closed`
        (answer 503) once `close_admission()` was called."""
        if self.closed:
            raise Closed(req.pool, req.queue_s)
        queue = self._queues[req.group]
        if req.bypass or queue.depth == 0:  # never overtake requests already waiting
            with self._claim():
                s = self.choose(req)
                if s is not None:
                    return self._lease(req, s)
        if queue.full() or (self.shared is not None and self.shared.queue_depth() >= queue.max_size):
            raise self._reject(req, "queue_full", 0.0)
        t0 = time.monotonic()
        deadline = t0 + self.cfg.queue_timeout
        seq = queue.next_seq()
        while True:
            remaining = deadline - time.monotonic()
            self._publish_depth(joining=1)  # this request, about to wait (out of `depth` between waits)
            try:
                woken = remaining > 0 and await queue.wait(req.priority, seq, min(remaining, self._recheck_s))
            except asyncio.CancelledError:  # the client went away: the caller records how long it waited
                req.queue_s = time.monotonic() - t0
                self._publish_depth()
                raise
            if self.closed:  # the shutdown deadline: nobody leaves the queue for an upstream any more
                req.queue_s = time.monotonic() - t0
                self._publish_depth()
                raise Closed(req.pool, req.queue_s)
            if not woken and time.monotonic() >= deadline:
                self._publish_depth()
                raise self._reject(req, "queue_timeout", time.monotonic() - t0)
            with self._claim():
                s = self.choose(req)
                if s is not None:
                    req.queue_s = time.monotonic() - t0
                    lease = self._lease(req, s)
            if s is not None:
                if queue.depth:
                    queue.wake()  # there may be room for the next one too
                self._publish_depth()
                return lease

    def close_admission(self) -> int:
        """The shutdown deadline: every request waiting in an admission queue, and any later
        `acquire()`, raises `Closed`; returns how many were waiting. (Without it, waiters would be
        admitted after the deadline and cut mid-stream when the server drops its connections.)"""
        self.closed = True
        return sum(queue.wake_all() for queue in self._queues.values())

    def _reject(self, req: RouteRequest, reason: str, waited: float) -> Rejected:
        bump(self.metrics.rejections, (req.pool, reason))
        req.queue_s = waited
        return Rejected(reason, req.pool, retry_after(self.cfg.queue_timeout), waited)

    def _lease(self, req: RouteRequest, s: UpstreamState) -> Lease:
        req.tried.append(s)
        return Lease(s, req.prompt_tokens, req.output_tokens, req.pool, req.queue_s, req.attempt)

    def release(self, lease: Lease, outcome: str = health.OK, ttft: float | None = None,
                tpot: float | None = None) -> None:
        """End of an attempt: give the tokens back, learn latency/health, wake a waiter."""
        s = lease.close()
        if s is None:
            return
        if outcome == health.OK:
            s.observe_latency(ttft, tpot)
        if self._multi and health.passive(s, outcome, time.monotonic(), self.cfg.health):
            bump(self.metrics.ejections, (s.name, outcome))
            s.last_reason = f"ejected for {s.backoff_s:g}s after {outcome}"
        if self.admission:
            for group in self._groups_of[s]:
                queue = self._queues[group]
                if queue.depth:
                    queue.wake()

    def retry(self, req: RouteRequest, lease: Lease, outcome: str) -> Lease | None:
        """Release a failed attempt; a lease on another upstream of the same group when the
        failure is retryable (connect error, reset or 503 before the response head), else None.
        Call only when no byte of the response reached the client."""
        self.release(lease, outcome)
        if outcome not in RETRYABLE or req.attempt >= self.cfg.retries:
            return None
        with self._claim():
            s = self.choose(req, exclude=req.tried)
            if s is None:
                return None
            req.attempt += 1
            lease = self._lease(req, s)
        bump(self.metrics.retries, (req.pool, outcome))
        return lease

    def _publish_depth(self, joining: int = 0) -> None:
        """--workers N: this worker's waiters (and `joining`, one about to wait again), for the
        gateway-wide queue depth."""
        if self.shared is not None:
            self.shared.set_queue_depth(sum(q.depth for q in self._queues.values()) + joining)

    # ---------------------------------------------------------------- reading
    def ready(self) -> bool:
        """False when some pool has no upstream taking traffic (for /readyz)."""
        now = time.monotonic()
        return all(any(s.eligible(now) for s in members) for members in self.pools.values())

    def inflight(self) -> Iterable[tuple[str, int, int]]:
        return [(s.name, s.inflight_requests, s.inflight_tokens) for s in self.states]

    def queue_depths(self) -> Iterable[tuple[str, int]]:
        depths: dict[str, int] = {}
        for group, queue in self._queues.items():
            if group.pool != _ALL:
                depths[group.pool] = depths.get(group.pool, 0) + queue.depth
        return list(depths.items())

    def health_states(self) -> Iterable[tuple[str, str, bool]]:
        now = time.monotonic()
        return [(s.name, s.pool, s.eligible(now)) for s in self.states]

    def collector(self) -> RoutingCollector:
        return RoutingCollector(self.metrics, self.queue_depths, self.health_states)

    def status(self) -> dict:
        """For /slogate/status: policy, pools and each upstream's state and last choice/skip reason."""
        now = time.monotonic()
        return {
            "policy": self.policy_name,
            "pool_rules": [r.text for r in self.rules],
            "ready": self.ready(),
            "pools": {pool: {"upstreams": [s.name for s in members],
                             "healthy": sum(1 for s in members if s.eligible(now))}
                      for pool, members in self.pools.items()},
            "queue_depth": dict(self.queue_depths()),
            "upstreams": [s.status(now) for s in self.states],
        }

    # ------------------------------------------------------- background tasks
    async def start(self, on_health_change: Callable[[UpstreamState, bool], None] | None = None) -> None:
        """Start active health checks and metric scraping (whichever is configured)."""
        cfg = self.cfg
        probes = self.shared is None or self.shared.runs_probes  # --workers N: worker 0 probes for all
        checks = self.health_interval > 0 and probes
        scrapes = cfg.scrape_upstream_metrics and probes
        if not checks and not scrapes:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4 * len(self.states) + 4),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        if checks:  # with --workers N the verdict and the scraped load are shared (routing/shared_state.py)
            def changed(s: UpstreamState, healthy: bool) -> None:
                s.last_reason = "back in service: health checks pass" if healthy else _SKIP_UNHEALTHY
                if on_health_change is not None:
                    on_health_change(s, healthy)

            self._tasks.append(asyncio.create_task(
                health.health_loop(self._session, self.states, cfg.health, self.health_interval, changed)))
        if scrapes:
            timeout = min(cfg.scrape_interval, 5.0)
            self._tasks.append(asyncio.create_task(
                scrape_loop(self._session, self.states, cfg.scrape_interval, timeout)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
