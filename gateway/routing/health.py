"""Upstream health: passive ejection from request outcomes and active `/health` checks.

Passive: a connect error ejects at once, `eject_after` consecutive 5xx/timeouts eject; the ejection
lasts `eject_base · 2^(k-1)` (capped) and ends by itself; a success resets the back-off. Active:
a background loop GETs each upstream's health path. Never touches the relay's client sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import aiohttp
import msgspec

from slogate.gateway.routing.upstreams import UpstreamState
from slogate.traces.record import ErrorClass

# Request outcomes the relay reports (`Router.release`).
OK = "ok"
CONNECT_ERROR = "connect_error"  # refused / unreachable: nothing reached the upstream
RESET_BEFORE_RESPONSE = "reset_before_response"  # connection dropped before the response head
HTTP_5XX = "http_5xx"
HTTP_503 = "http_503"  # 503 before the first byte: retryable
TIMEOUT = "timeout"
OTHER = "other"  # 4xx, client abort, error after streaming started: says nothing about health
FAILURES = frozenset({CONNECT_ERROR, RESET_BEFORE_RESPONSE, HTTP_5XX, HTTP_503, TIMEOUT})


# Error classes that speak about the upstream's health by themselves (status aside).
_ERROR_OUTCOMES: dict[ErrorClass, str] = {
    "connect": CONNECT_ERROR, "timeout_connect": CONNECT_ERROR, "timeout_ttfb": TIMEOUT,
    "timeout_idle": TIMEOUT, "timeout_total": TIMEOUT, "protocol": HTTP_5XX,
}


def outcome_of(status: int, error: ErrorClass | None, *, started: bool) -> str:
    """A request's outcome for health accounting, from the gateway's status and error class.

    `started`: response bytes went to the client (a reset then is not "before the response").
    Client disconnects, shutdown, stream error events and 4xx say nothing about health (OTHER)."""
    if error is None:
        if 200 <= status < 300:
            return OK
        error = "upstream_status"
    if error == "upstream_status":
        if status == 503:
            return HTTP_503
        return HTTP_5XX if 500 <= status < 600 else OTHER
    if error == "reset":
        return HTTP_5XX if started else RESET_BEFORE_RESPONSE
    return _ERROR_OUTCOMES.get(error, OTHER)


class HealthConfig(msgspec.Struct, forbid_unknown_fields=True):
    interval: float | None = None  # active checks every N s; None: 5 s with several upstreams; 0: off
    path: str = "/health"
    timeout: float = 2.0
    healthy_threshold: int = 2  # consecutive good checks to come back
    unhealthy_threshold: int = 2  # consecutive failed checks to go out
    eject_after: int = 3  # consecutive 5xx/timeouts before a passive ejection (connect errors: 1)
    eject_base: float = 2.0  # first ejection (s); doubles per consecutive ejection
    eject_max: float = 60.0


def passive(state: UpstreamState, outcome: str, now: float, cfg: HealthConfig) -> bool:
    """Account one request outcome; True when it ejected the upstream now."""
    if outcome == OK:
        state.fail_streak = 0
        state.backoff_s = 0.0
        return False
    if outcome not in FAILURES:
        return False
    state.fail_streak += 1
    if outcome != CONNECT_ERROR and state.fail_streak < cfg.eject_after:
        return False
    if now < state.ejected_until:
        return False  # already out (requests that started before the ejection)
    state.backoff_s = cfg.eject_base if state.backoff_s == 0 else min(cfg.eject_max, state.backoff_s * 2)
    state.ejected_until = now + state.backoff_s
    state.ejections += 1
    state.fail_streak = 0
    return True


def active_result(state: UpstreamState, ok: bool, cfg: HealthConfig) -> bool | None:
    """Account one active check; returns the new `healthy` value when it flipped, else None."""
    if ok:
        state.check_fails = 0
        state.ok_streak += 1
        if not state.healthy and state.ok_streak >= cfg.healthy_threshold:
            state.healthy = True
            state.backoff_s = 0.0
            state.ejected_until = 0.0  # back in service: not also kept out by a passive back-off
            return True
        return None
    state.ok_streak = 0
    state.check_fails += 1
    if state.healthy and state.check_fails >= cfg.unhealthy_threshold:
        state.healthy = False
        return False
    return None


async def check_once(session: aiohttp.ClientSession, state: UpstreamState, cfg: HealthConfig) -> bool:
    url = state.spec.url.rstrip("/") + cfg.path
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=cfg.timeout)) as resp:
            await resp.read()
            return 200 <= resp.status < 300
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def health_loop(session: aiohttp.ClientSession, states: Sequence[UpstreamState], cfg: HealthConfig,
                      interval: float, on_change: Callable[[UpstreamState, bool], None]) -> None:
    """Check every upstream each `interval` seconds, concurrently; runs until cancelled."""
    while True:
        results = await asyncio.gather(*(check_once(session, s, cfg) for s in states))
        for s, ok in zip(states, results, strict=True):
            flipped = active_result(s, ok, cfg)
            if flipped is not None:
                on_change(s, flipped)
        await asyncio.sleep(interval)
