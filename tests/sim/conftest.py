"""Fixtures for the simulator tests: sim servers on free ports (always stopped), an HTTP session.

`sim_server(**opts)` is a factory fixture for tests that need their own flags; `sim_constant`
and `sim_roofline` are shared per module. All of them use tests.simserver.start_sim.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest
import pytest_asyncio

from tests.servers import Server
from tests.simserver import start_sim


@pytest.fixture
def sim_server() -> Iterator[Callable[..., Server]]:
    """Start sim servers with any start_sim options; all stop at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda **opts: stack.enter_context(start_sim(**opts))


@pytest.fixture(scope="module")
def sim_constant() -> Iterator[Server]:
    """Constant timing: TTFT 40 ms, ITL 5 ms, independent of load."""
    with start_sim(timing="constant", ttft_ms=40, itl_ms=5, extra_args=["--enable-prompt-tokens-details"]) as s:
        yield s


@pytest.fixture(scope="module")
def sim_roofline() -> Iterator[Server]:
    with start_sim(seed=1) as s:
        yield s


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


def parse_sse(raw: bytes) -> list[dict | str]:
    """SSE `data:` payloads of a response body: dicts, or the string "[DONE]"."""
    import orjson

    out: list[dict | str] = []
    for block in raw.split(b"\n\n"):
        block = block.strip()
        if block.startswith(b"data: "):
            payload = block[6:]
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out
