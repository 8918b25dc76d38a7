"""Scrape each upstream engine's Prometheus `/metrics` for its queue length and KV-cache usage.

vLLM, SGLang and llama.cpp names are understood (traces.engine_metrics). Only the few relevant lines are kept and parsed
with prometheus_client's text parser in a worker thread, never on the event loop; the router
ignores values older than the stale timeout. Never touches the relay's client sessions.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from slogate.gateway.routing.upstreams import UpstreamState
from slogate.traces.engine_metrics import KV_CACHE_USAGE, WAITING, combine_usage

# Requests waiting are summed over label sets; KV-cache usage (0..1) combines by `combine_usage`.
_PREFIXES = tuple(n.encode() for n in (*WAITING, *KV_CACHE_USAGE))


def parse_engine_load(text: bytes) -> tuple[float, float] | None:
    """(waiting requests, KV-cache usage 0..1) from a metrics page; None when it has neither."""
    lines = [line for line in text.splitlines() if line.startswith(_PREFIXES)]
    if not lines:
        return None
    waiting = 0.0
    usages: list[float] = []
    found = False
    for family in text_string_to_metric_families(b"\n".join(lines).decode("utf-8", "replace") + "\n"):
        for sample in family.samples:
            value = sample.value
            if not math.isfinite(value):
                continue
            if sample.name in WAITING:
                waiting += value
                found = True
            elif sample.name in KV_CACHE_USAGE:
                usages.append(value)
                found = True
    return (waiting, combine_usage(usages) or 0.0) if found else None


async def scrape_once(session: aiohttp.ClientSession, state: UpstreamState, timeout: float) -> bool:
    url = state.spec.url.rstrip("/") + "/metrics"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return False
            body = await resp.read()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
    try:
        load = await asyncio.to_thread(parse_engine_load, body)
    except ValueError:
        return False  # not Prometheus text
    if load is None:
        return False
    state.scraped_waiting, state.scraped_kv_usage = load
    state.scraped_at = time.monotonic()
    return True


async def scrape_loop(session: aiohttp.ClientSession, states: Sequence[UpstreamState], interval: float,
                      timeout: float) -> None:
    """Scrape every upstream each `interval` seconds, concurrently; runs until cancelled."""
    while True:
        await asyncio.gather(*(scrape_once(session, s, timeout) for s in states))
        await asyncio.sleep(interval)
