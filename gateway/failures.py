"""How a failed exchange ends toward the client, once response bytes were already forwarded.

Headers (and maybe events) went out: an SSE stream gets one error event and `[DONE]`; any other
body cannot carry an error, so the connection is cut and the client sees a truncated response.
(Before the first byte the answer is a JSON error: gateway.errors.json_error.) Never records
anything and never raises: the client may be gone already.
"""

from __future__ import annotations

from slogate.gateway.errors import sse_error
from slogate.gateway.http_server import ClientConn
from slogate.traces.record import ErrorClass


def end_late(client: ClientConn, code: ErrorClass, *, sse: bool, last_out: bytes) -> None:
    """End a response under way with the failure `code`; `last_out`: the last bytes forwarded."""
    if sse and client.chunked:
        clean = last_out.endswith(b"\n\n") or last_out.endswith(b"\r\n\r\n") or last_out.endswith(b"\r\r")
        client.end(sse_error(code, new_event=clean))
        return
    client.cut()  # a length-delimited or non-SSE body cannot carry an error: the client sees a failure
