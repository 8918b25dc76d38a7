"""Admission queue: requests wait here when every upstream of their group is at its in-flight limit.

Bounded; served by priority (higher first) then arrival order; a waiter gives up after its timeout
and the caller answers 429 with `Retry-After`. Waking is a synchronous `wake()` on release; the
queue never polls, never sleeps and never holds request bodies beyond the waiting coroutine.
"""

from __future__ import annotations

import asyncio
import heapq
import math

import orjson

from slogate.gateway.http_server import Reply


class Rejected(Exception):
    """No room: queue full (`reason="queue_full"`) or waited too long (`"queue_timeout"`).

    The reason is the 429 body's `code` and a metrics label; the record's error class is `rejected`."""

    def __init__(self, reason: str, pool: str, retry_after_s: int, queue_s: float = 0.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pool = pool
        self.retry_after_s = retry_after_s
        self.queue_s = queue_s


class Closed(Exception):
    """The gateway's shutdown deadline passed while the request waited (or before it asked): no
    upstream is chosen any more; the caller answers 503 `shutdown` (gateway.errors)."""

    def __init__(self, pool: str, queue_s: float) -> None:
        super().__init__("shutdown")
        self.pool = pool
        self.queue_s = queue_s


class AdmissionQueue:
    """Waiters of one group: a heap of (-priority, seq, push, future). A waiter that waits again
    (a timed re-check) keeps its seq, so its place; `push` keeps the entries distinct."""

    __slots__ = ("_heap", "_pushes", "_seq", "depth", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._heap: list[tuple[int, int, int, asyncio.Future]] = []
        self._seq = 0
        self._pushes = 0
        self.depth = 0  # live waiters

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def wait(self, priority: int, seq: int, timeout: float) -> bool:
        """Wait for a `wake()`; False on timeout. The caller checks `full()` before a first wait."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pushes += 1
        heapq.heappush(self._heap, (-priority, seq, self._pushes, fut))
        self.depth += 1
        try:
            if timeout > 0:
                await asyncio.wait((fut,), timeout=timeout)
        except BaseException:  # the request was cancelled (client went away)
            if fut.done():
                self.wake()  # pass a wake-up we can no longer use to the next waiter
            raise
        finally:
            if not fut.done():  # timed out (or cancelled)
                fut.cancel()
                self.depth -= 1
        return not fut.cancelled()

    def wake_all(self) -> int:
        """Let every live waiter try again (the shutdown deadline); how many there were."""
        n = 0
        while self.wake():
            n += 1
        return n

    def full(self) -> bool:
        return self.depth >= self.max_size

    def wake(self) -> bool:
        """Let the first live waiter try again; False when nobody waits."""
        heap = self._heap
        while heap:
            _, _, _, fut = heapq.heappop(heap)
            if not fut.done():
                fut.set_result(None)
                self.depth -= 1
                return True
        return False


def retry_after(queue_timeout_s: float) -> int:
    """Seconds a rejected client should wait: the queue timeout rounded up, at least 1."""
    return max(1, math.ceil(queue_timeout_s))


def parse_priority(value: str | None) -> int:
    """`x-slogate-priority` header value -> int (higher first); missing or malformed -> 0."""
    if not value:
        return 0
    try:
        return max(-1000, min(1000, int(value.strip())))
    except ValueError:
        return 0


def rejection_response(rejected: Rejected) -> Reply:
    """429 in OpenAI's error shape with `Retry-After`."""
    why = "the admission queue is full" if rejected.reason == "queue_full" else "timed out in the admission queue"
    body = {"error": {
        "message": f"all upstreams of pool {rejected.pool!r} are at their in-flight limit and {why}; "
                   f"retry after {rejected.retry_after_s}s",
        "type": "rate_limit_exceeded", "param": None, "code": rejected.reason}}
    return Reply(429, orjson.dumps(body), headers=(("Retry-After", str(rejected.retry_after_s)),))
