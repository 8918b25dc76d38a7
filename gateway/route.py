"""Route: choose the upstream for one request.

Today a round-robin over the configured upstreams; the seam for least-tokens, prefix affinity
and pools (a later issue) is `Router.pick_upstream(info)`. Never awaits, never reads the body.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.upstream import Upstream
from traces.request_info import RequestInfo


class Router:
    __slots__ = ("_next", "upstreams")

    def __init__(self, upstreams: Sequence[Upstream]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream")
        self.upstreams = list(upstreams)
        self._next = 0

    def pick_upstream(self, info: RequestInfo | None) -> Upstream:
        """The upstream for a request (`info` is None for non-LLM paths)."""
        ups = self.upstreams
        if len(ups) == 1:
            return ups[0]
        i = self._next
        self._next = (i + 1) % len(ups)
        return ups[i]
