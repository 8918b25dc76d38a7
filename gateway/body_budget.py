"""Bound request-body memory: one budget of request-body bytes held in flight on the proxy port.

The server (gateway.http_server) takes a body's bytes from the budget before it buffers them and gives
them back once the upstream has the request (or the request ended); a body that does not fit is
answered 503 and counted by reason. Never reads or keeps body bytes itself, never logs per request.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

DEFAULT_BUDGET_BYTES = 256 << 20
REASONS = ("body_budget", "body_too_large")  # 503: the budget is spent; 413: one body over --max-body-bytes


class BodyBudget:
    """Bytes of request bodies buffered now, against `limit`; refusals counted per reason."""

    __slots__ = ("held", "limit", "peak", "rejected")

    def __init__(self, limit: int = DEFAULT_BUDGET_BYTES) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.rejected = dict.fromkeys(REASONS, 0)

    def take(self, n: int) -> bool:
        """Reserve `n` bytes; False (and counted) when they do not fit."""
        held = self.held + n
        if held > self.limit:
            self.rejected["body_budget"] += 1
            return False
        self.held = held
        if held > self.peak:
            self.peak = held
        return True

    def give(self, n: int) -> None:
        self.held -= n

    def too_large(self) -> None:
        self.rejected["body_too_large"] += 1

    def refusal_body(self) -> bytes:
        """The JSON body of the 503 for a body that does not fit (OpenAI's error shape)."""
        body = {"error": {
            "message": f"the gateway holds its limit of request-body bytes in flight ({self.limit} bytes); "
                       "retry later, or raise --max-inflight-body-bytes (gateway.max_inflight_body_bytes)",
            "type": "server_error", "param": None, "code": "body_budget"}}
        return orjson.dumps(body)

    def collector(self) -> Collector:
        return _Collector(self)


class _Collector(Collector):
    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget

    def collect(self) -> Iterable:
        b = self.budget
        r = CounterMetricFamily("slogate_client_requests_rejected",
                                "Client requests refused before their body was read: body_budget (503, the in-flight "
                                "body budget is spent) or body_too_large (413, over --max-body-bytes).",
                                labels=["reason"])
        for reason, n in b.rejected.items():
            r.add_metric([reason], n)
        yield r
        yield GaugeMetricFamily("slogate_client_body_bytes_inflight",
                                "Request-body bytes buffered now (counted against --max-inflight-body-bytes).",
                                value=b.held)
        yield GaugeMetricFamily("slogate_client_body_bytes_budget", "The in-flight request-body budget (bytes).",
                                value=b.limit)
