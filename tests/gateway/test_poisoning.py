"""Input that cannot poison the gateway's state: `x-slogate-*` control headers count (and reach the
upstream) only from trusted clients, and a huge `model` name is cut to 256 bytes in the trace."""

from __future__ import annotations

import contextlib
import socketserver
import threading
from collections.abc import Iterator

import orjson
import pytest

from slogate.traces.request_info import MAX_MODEL_BYTES, request_info
from tests.gateway.fixtures_gateway import http_request, start_gateway, trace_records, wait_for

pytestmark = pytest.mark.timeout(60)


class _Echo(socketserver.BaseRequestHandler):
    """Answers every request with its own header block as a JSON string (a non-streaming 200)."""

    def handle(self) -> None:
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                more = self.request.recv(1 << 20)
                if not more:
                    return
                data += more
            head, data = data.split(b"\r\n\r\n", 1)
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(data) < length:
                data += self.request.recv(1 << 20)
            data = data[length:]
            body = orjson.dumps({"head": head.decode("latin-1"), "choices": [], "usage": {"completion_tokens": 1}})
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))


@contextlib.contextmanager
def echo_upstream() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _upstream_head(url: str, headers: dict[str, str]) -> str:
    status, _, raw = http_request(url, "POST", "/v1/chat/completions", b'{"model":"m","messages":[]}',
                                  {"Content-Type": "application/json", **headers})
    assert status == 200, raw[:300]
    return orjson.loads(raw)["head"].lower()


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_control_headers_reach_the_upstream_only_from_trusted_clients():
    control = {"x-slogate-fault": "reset_after=1", "X-Slogate-Priority": "1000", "x-other": "kept"}
    with echo_upstream() as url:
        with start_gateway(url, "--trust-header-from", "10.0.0.0/8") as gw:  # the test client is 127.0.0.1
            head = _upstream_head(gw.url, control)
            assert "x-slogate" not in head and "x-other: kept" in head
        with start_gateway(url, "--trust-header-from", "none") as gw:
            assert "x-slogate" not in _upstream_head(gw.url, control)
        with start_gateway(url) as gw:  # loopback is trusted by default (the simulator's faults)
            head = _upstream_head(gw.url, control)
            assert "x-slogate-fault: reset_after=1" in head and "x-slogate-priority: 1000" in head


def test_a_5_mib_model_name_stores_at_most_256_bytes(tmp_path):
    huge = "m" * (5 << 20)
    assert request_info("/v1/chat/completions", {"model": "é" * 1000}).model == "é" * (MAX_MODEL_BYTES // 2)
    with echo_upstream() as url, start_gateway(url, "--trace-dir", str(tmp_path)) as gw:
        status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions",
                                    orjson.dumps({"model": huge, "messages": []}), {"Content-Type": "application/json"})
        assert status == 200
        (rec,) = trace_records(tmp_path, 1)
    assert rec.model is not None and len(rec.model.encode()) <= MAX_MODEL_BYTES and rec.model == "m" * 256
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 64 << 10


def test_readyz_fails_while_the_upstream_answers_only_errors():
    from tests.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every request is a connect error
    with start_gateway(dead, "--unready-after-errors", "0.5") as gw:
        assert http_request(gw.url, "GET", "/readyz")[0] == 200

        def failing_then_unready() -> bool:
            status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions", b'{"model":"m","messages":[]}',
                                        {"Content-Type": "application/json"})
            assert status == 502
            return http_request(gw.url, "GET", "/readyz")[0] == 503

        assert wait_for(failing_then_unready, timeout=10)
        assert wait_for(lambda: http_request(gw.url, "GET", "/readyz")[0] == 200, timeout=10)  # quiet: ready again
