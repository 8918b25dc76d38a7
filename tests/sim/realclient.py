"""Small load clients for the sim tests and the fidelity bench.

`run_plan` sends planned completions at their offsets (absolute schedule on perf_counter) and returns
token arrival times; `raw_streams` holds many streams open over bare asyncio connections (cheap on
CPU); `hist_quantile` reads a quantile off a Prometheus histogram.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence

import aiohttp

from slogate.replay.sim.engine import SimRequest


def prompt_of(n_tokens: int, salt: int = 0) -> str:
    """Exactly n tokens for the built-in tokenizer (≤4-letter words joined by spaces)."""
    return " ".join(f"w{(salt * 7919 + i) % 997:03d}" for i in range(n_tokens))


async def run_plan(url: str, plan: Sequence[SimRequest], model: str = "llama-3-8b"
                   ) -> tuple[list[list[float]], list[float]]:
    """Send each planned request at its arrival offset.

    Returns token times (s after each actual send) and the actual send offsets, so that a virtual
    run can replay what the server really received (a busy client sends late and in bursts).
    """
    out: list[list[float]] = [[] for _ in plan]
    sent_at: list[float] = [0.0] * len(plan)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as http:
        t0 = time.perf_counter() + 0.2

        async def one(i: int, r: SimRequest) -> None:
            body = {"model": model, "prompt": prompt_of(r.prompt_tokens, i), "max_tokens": r.output_tokens,
                    "ignore_eos": True, "stream": True}
            delay = t0 + r.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter()
            sent_at[i] = sent - t0
            async with http.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter() - sent
                    out[i].extend([now] * chunk.count(b'"text":"'))

        await asyncio.gather(*(one(i, r) for i, r in enumerate(plan)))
    return out, sent_at


def hist_quantile(text: str, name: str, q: float) -> float:
    """Linear-interpolated quantile from a Prometheus histogram's buckets."""
    pairs = []
    for m in re.finditer(name + r'_bucket\{[^}]*le="([^"]+)"[^}]*\} ([0-9.e+]+)', text):
        pairs.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
    total = pairs[-1][1]
    target, prev_le, prev_c = q * total, 0.0, 0.0
    for le, c in pairs:
        if c >= target:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (target - prev_c) / max(c - prev_c, 1e-9)
        prev_le, prev_c = le, c
    return prev_le


async def raw_streams(port: int, n: int, tokens: int) -> int:
    """n concurrent streams over raw asyncio connections (cheap on CPU, unlike a parsing client)."""
    loop = asyncio.get_running_loop()
    body = json.dumps({"model": "llama-3-8b", "prompt": prompt_of(100), "max_tokens": tokens,
                       "ignore_eos": True, "stream": True}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"

    class Reader(asyncio.Protocol):
        def __init__(self, done: asyncio.Future) -> None:
            self.done, self.n = done, 0

        def data_received(self, data: bytes) -> None:
            self.n += data.count(b'"text":"')
            if data.endswith(b"0\r\n\r\n") and not self.done.done():
                self.done.set_result(self.n)

        def connection_lost(self, exc) -> None:
            if not self.done.done():
                self.done.set_result(self.n)

    async def one(i: int) -> int:
        await asyncio.sleep(i * 0.002)
        done = loop.create_future()
        tr, _ = await loop.create_connection(lambda: Reader(done), "127.0.0.1", port)
        tr.write(head % len(body) + body)
        n = await done
        tr.close()
        return n

    return sum(await asyncio.gather(*(one(i) for i in range(n))))
