"""One upstream inference server: its URL, its shared client session and its in-flight load.

Each `Upstream` owns exactly one `aiohttp.ClientSession` for the life of the process (raised
connection limit, keep-alive, no auto-decompression, no cookies). Never opens a session per request.
"""

from __future__ import annotations

import aiohttp
import yarl

from gateway.config import Timeouts


class Upstream:
    """An upstream server and its live load (plain ints, updated by the relay)."""

    __slots__ = ("base", "inflight_requests", "inflight_tokens", "name", "session", "url")

    def __init__(self, url: str) -> None:
        parsed = yarl.URL(url)
        self.url = url.rstrip("/")
        self.base = self.url  # request raw path is appended to this
        # Label used in metrics and traces: host:port only (never credentials or paths).
        self.name = f"{parsed.host}:{parsed.explicit_port or parsed.port}"
        self.session: aiohttp.ClientSession | None = None
        self.inflight_requests = 0
        self.inflight_tokens = 0

    async def start(self, timeouts: Timeouts, max_connections: int) -> None:
        connector = aiohttp.TCPConnector(
            limit=max_connections,
            limit_per_host=0,
            keepalive_timeout=4.0,  # below uvicorn's 5 s (vLLM, llama.cpp server): no reuse race
            ttl_dns_cache=60,
            enable_cleanup_closed=False,
        )
        connect = None if timeouts.connect == float("inf") else timeouts.connect
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,  # bytes pass through unchanged
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect),
            trust_env=False,
            read_bufsize=1 << 16,
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    @property
    def ready(self) -> bool:
        return self.session is not None and not self.session.closed
