"""Tiny in-process HTTP servers for tests: `serve_in_thread` runs a request handler on a port the kernel
picked; `otlp_receiver` is a real OTLP/HTTP receiver on it, keeping every POSTed body by path
(`/v1/traces`, `/v1/metrics`), which the tests decode with opentelemetry-proto."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections import defaultdict
from collections.abc import Iterator


@contextlib.contextmanager
def serve_in_thread(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` on 127.0.0.1 in a thread (one more per connection) until the block exits; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


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
