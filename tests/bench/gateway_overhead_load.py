"""Client side of tests/bench/gateway_overhead.py: one worker process drives streaming load.

Own uvloop + aiohttp session per process, so the client is not the bottleneck; times each response by
its bytes like the StreamObserver (first output-bearing piece, last byte), never decoding JSON."""

from __future__ import annotations

import asyncio
import random
import re
import resource
import time
from dataclasses import dataclass, field

import aiohttp

# An output-bearing SSE chunk: non-empty `text` (completions) or `content` (chat) string.
_OUTPUT = re.compile(rb'"(?:text|content)"\s*:\s*"[^"]')
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


@dataclass
class LoadSpec:
    """One worker's share of a round: open-loop Poisson at `rate` or closed-loop `concurrency`."""

    url: str
    body: bytes
    mode: str  # "poisson" | "closed"
    duration: float
    start_at: float  # wall-clock (time.time()) when every worker starts sending
    rate: float = 0.0
    concurrency: int = 0
    stagger: float = 0.0  # closed loop: each stream starts after a random delay in [0, stagger) s
    seed: int = 0


@dataclass
class LoadResult:
    ttft_us: list[int] = field(default_factory=list)
    e2e_us: list[int] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    done_in_window: int = 0  # requests completed before the window closed (throughput)
    chunks_in_window: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    lag_us: list[int] = field(default_factory=list)  # open loop: actual − intended send time
    client_cpu_s: float = 0.0


def run(spec: LoadSpec) -> LoadResult:
    """Entry point in the worker process."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a core dependency on Linux
        runner = asyncio.run
    cpu0 = _cpu()
    result = runner(_run(spec))
    result.client_cpu_s = _cpu() - cpu0
    return result


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(spec: LoadSpec) -> LoadResult:
    out = LoadResult()
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        start = time.perf_counter() + (spec.start_at - time.time())
        end = start + spec.duration
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        if spec.mode == "poisson":
            await _poisson(session, spec, start, end, out)
        else:
            rng = random.Random(spec.seed)
            delays = [rng.uniform(0, spec.stagger) for _ in range(spec.concurrency)]
            await asyncio.gather(*(_closed(session, spec, end, out, d) for d in delays))
    return out


async def _poisson(
    session: aiohttp.ClientSession, spec: LoadSpec, start: float, end: float, out: LoadResult
) -> None:
    rng = random.Random(spec.seed)
    tasks: set[asyncio.Task] = set()
    t = start
    while True:
        t += rng.expovariate(spec.rate)
        if t >= end:
            break
        delay = t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        out.lag_us.append(int((time.perf_counter() - t) * 1e6))
        task = asyncio.create_task(_one(session, spec, end, out))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def _closed(
    session: aiohttp.ClientSession, spec: LoadSpec, end: float, out: LoadResult, delay: float
) -> None:
    """One closed-loop stream slot; the staggered start keeps slots from moving in lockstep."""
    await asyncio.sleep(delay)
    while time.perf_counter() < end:
        await _one(session, spec, end, out)


async def _one(session: aiohttp.ClientSession, spec: LoadSpec, end: float, out: LoadResult) -> None:
    t0 = time.perf_counter_ns()
    first = 0
    chunks = 0
    try:
        async with session.post(spec.url, data=spec.body, headers=_HEADERS) as resp:
            status = resp.status
            async for piece in resp.content.iter_any():
                found = len(_OUTPUT.findall(piece))
                if found:
                    if not first:
                        first = time.perf_counter_ns()
                    chunks += found
        last = time.perf_counter_ns()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        _error(out, type(exc).__name__)
        return
    if status != 200 or not first:
        _error(out, f"http_{status}" if status != 200 else "no_output")
        return
    out.ttft_us.append((first - t0) // 1000)
    out.e2e_us.append((last - t0) // 1000)
    out.chunks.append(chunks)
    if last * 1e-9 <= end:
        out.done_in_window += 1
        out.chunks_in_window += chunks


def _error(out: LoadResult, kind: str) -> None:
    out.errors += 1
    out.error_kinds[kind] = out.error_kinds.get(kind, 0) + 1
