"""How a failed exchange ends toward the client, once response bytes were already forwarded.

Headers (and maybe events) went out: an SSE stream gets one error event and `[DONE]`; any other
body cannot carry an error, so the connection is cut and the client sees a truncated response.
(Before the first byte the answer is a JSON error: gateway.errors.json_error.) Never records
anything and never raises: the client may be gone already.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from slogate.gateway.errors import sse_error
from slogate.traces.record import ErrorClass


async def end_late(request: web.Request, resp: web.StreamResponse, code: ErrorClass, *, sse: bool,
                   last_out: bytes) -> None:
    """End a response under way with the failure `code`; `last_out`: the last bytes forwarded."""
    if sse or resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        clean = last_out.endswith(b"\n\n") or last_out.endswith(b"\r\n\r\n") or last_out.endswith(b"\r\r")
        try:
            await resp.write(sse_error(code, new_event=clean))
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError, asyncio.CancelledError):
            pass  # client gone, or the stream had just ended (write after EOF)
        return
    resp.force_close()  # a non-SSE body cannot carry an error: cut it so the client sees a failure
    transport = request.transport
    if transport is not None:
        transport.abort()
