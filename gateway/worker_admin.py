"""A worker's private admin endpoint (`--workers N`): its status rows for the supervisor to merge.

Served only on the worker's Unix socket (gateway/server.py), never on a TCP port. The rows are the
status window's slim records (no text, headers or addresses); the supervisor recomputes one summary
from all workers' rows (gateway/admin_merge.py). Never computes percentiles itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from slogate.gateway.http_server import Reply
from slogate.gateway.status import StatusRow

WORKER_STATUS_PATH = "/slogate/worker/status"


class WorkerStatus(msgspec.Struct):
    """One worker's share of `/slogate/status`."""

    requests_total: int
    rows: list[StatusRow]
    extras: dict[str, Any]  # Gateway.status_extras(): upstreams, routing, trace, event-loop lag


_encoder = msgspec.msgpack.Encoder()
decode_worker_status = msgspec.msgpack.Decoder(WorkerStatus).decode


def worker_status_endpoint(gateway: Any) -> Callable[[], Awaitable[Reply]]:
    """The admin endpoint for WORKER_STATUS_PATH on `gateway` (a server.Gateway)."""

    async def handle() -> Reply:
        doc = WorkerStatus(gateway.status.total_requests, list(gateway.status.rows), gateway.status_extras())
        return Reply(200, _encoder.encode(doc), "application/msgpack")

    return handle
