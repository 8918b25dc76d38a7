"""`--scrape-metrics`: sample the target's Prometheus `/metrics` during a run into `metrics.jsonl`.

Keeps the engine gauges and counters that explain latency (waiting/running requests, KV-cache
usage, preemptions, prefix-cache queries/hits) under one name per idea, summed over label sets.
Each line's `t` is seconds from the schedule start, the same origin as the records' `t`. Runs on
the orchestrator's loop, never on a sender's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path

import aiohttp
import orjson

# slogate name <- names used by vLLM (and slogate sim), SGLang, llama.cpp
NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                       "llamacpp:kv_cache_usage_ratio"),
    "preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
}
_LOOKUP = {src: name for name, srcs in NAMES.items() for src in srcs}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse_metrics(text: str) -> dict[str, float]:
    """The known metrics of a Prometheus text exposition, summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name = _LOOKUP.get(m.group(1))
        if name is None:
            continue
        try:
            out[name] = out.get(name, 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


async def fetch(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> dict[str, float] | None:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        async with session.get(url + "/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                return parse_metrics(await resp.text())
    return None


async def scrape(session: aiohttp.ClientSession, url: str, headers: dict[str, str], *, interval_s: float,
                 start: float, path: Path) -> int:
    """Sample until cancelled; returns samples written. `start` is the schedule's perf_counter origin."""
    written = 0
    with open(path, "ab") as f:
        try:
            while True:
                t = time.perf_counter() - start
                sample = await fetch(session, url, headers)
                if sample is not None:
                    f.write(orjson.dumps({"t": round(t, 6), "metrics": sample}) + b"\n")
                    f.flush()
                    written += 1
                await asyncio.sleep(interval_s)
        except asyncio.CancelledError:
            sample = await fetch(session, url, headers)
            if sample is not None:
                f.write(orjson.dumps({"t": round(time.perf_counter() - start, 6), "metrics": sample}) + b"\n")
                written += 1
    return written
