"""A worker's private admin endpoint (`--workers N`): its status rows for the supervisor to merge.

Served only on the worker's Unix socket (gateway/server.py), never on a TCP port. The rows are the
status window's slim records (no text, headers or addresses); the supervisor recomputes one summary
from all workers' rows (gateway/admin_merge.py). Never computes percentiles itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.web_request import BaseRequest

from slogate.gateway.status import StatusRow

WORKER_STATUS_PATH = "/slogate/worker/status"


class WorkerStatus(msgspec.Struct):
    """One worker's share of `/slogate/status`."""

    requests_total: int
    rows: list[StatusRow]
    extras: dict[str, Any]  # Gateway.status_extras(): upstreams, routing, trace, event-loop lag


_encoder = msgspec.msgpack.Encoder()
decode_worker_status = msgspec.msgpack.Decoder(WorkerStatus).decode


def worker_status_endpoint(gateway: Any) -> Callable[[BaseRequest], Awaitable[web.Response]]:
    """The handler for WORKER_STATUS_PATH on `gateway` (a server.Gateway)."""

    async def handle(request: BaseRequest) -> web.Response:
        doc = WorkerStatus(gateway.status.total_requests, list(gateway.status.rows), gateway.status_extras())
        return web.Response(body=_encoder.encode(doc), content_type="application/msgpack")

    return handle
