"""A real OTLP/HTTP receiver for tests: a threaded HTTP server that keeps every POSTed body by path
(`/v1/traces`, `/v1/metrics`); the tests decode them with opentelemetry-proto."""

from __future__ import annotations

import contextlib
import http.server
from collections import defaultdict
from collections.abc import Iterator

from tests.servers import serve_in_thread


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, dict[str, list[bytes]]]]:
    """(its URL, path → the bodies received so far), on a port the kernel picked."""
    bodies: dict[str, list[bytes]] = defaultdict(list)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies[self.path].append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    with serve_in_thread(Handler) as url:
        yield url, bodies
