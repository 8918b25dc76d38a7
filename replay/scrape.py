"""`--scrape-metrics`: sample the target's Prometheus `/metrics` during a run into `metrics.jsonl`.

Keeps the engine gauges and counters that explain latency (waiting/running requests, KV-cache
usage, preemptions, prefix-cache queries/hits) under one name per idea (traces.engine_metrics).
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

from slogate.traces.engine_metrics import FRACTIONS, IDEA_OF, combine_usage

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse_metrics(text: str) -> dict[str, float]:
    """The known metrics of a Prometheus text exposition (traces.engine_metrics names): counts
    summed over label sets, fractions (KV-cache usage) combined by `combine_usage`."""
    out: dict[str, float] = {}
    fractions: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name = IDEA_OF.get(m.group(1))
        if name is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if name in FRACTIONS:
            fractions.setdefault(name, []).append(value)
        else:
            out[name] = out.get(name, 0.0) + value
    for name, values in fractions.items():
        combined = combine_usage(values)
        if combined is not None:
            out[name] = combined
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
