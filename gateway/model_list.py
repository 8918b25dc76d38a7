"""The model names the upstreams serve, read from their `GET /v1/models` every `interval` seconds:
with the config's `models=` the only names that become metric labels (LiveMetrics.listed_models).
Runs off the request path and sends no client data; a list is capped (`MAX_LISTED` names of at most
`MAX_NAME_BYTES` each) and an upstream that answers nothing keeps the last list it gave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import aiohttp
import orjson

MAX_LISTED = 256
MAX_NAME_BYTES = 256


def parse_model_list(body: bytes) -> list[str] | None:
    """The `data[].id` strings of an OpenAI `/v1/models` answer (None when it is not one)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    return [i for i in ids if 0 < len(i.encode()) <= MAX_NAME_BYTES][:MAX_LISTED]


async def fetch_models(session: aiohttp.ClientSession, base_url: str, timeout: float) -> list[str] | None:
    try:
        async with session.get(base_url.rstrip("/") + "/v1/models",
                               timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return None
            return parse_model_list(await resp.content.read(1 << 20))
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None


async def watch_models(urls: Sequence[str], on_models: Callable[[frozenset[str]], None], *,
                       interval: float = 30.0, timeout: float = 5.0) -> None:
    """Until cancelled: ask every upstream, then call `on_models` with the union of the lists known."""
    last: dict[str, list[str]] = {}
    async with aiohttp.ClientSession() as session:
        while True:
            lists = await asyncio.gather(*(fetch_models(session, u, timeout) for u in urls))
            for url, ids in zip(urls, lists, strict=True):
                if ids is not None:
                    last[url] = ids
            if last:
                on_models(frozenset(i for ids in last.values() for i in ids))
            await asyncio.sleep(interval)
