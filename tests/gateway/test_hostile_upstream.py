"""A real `slogate gateway` in front of an upstream with hostile HTTP/1.1 framing (tests/hostile_upstream.py):
Content-Length with chunked is never forwarded, the client connection stays in step, bad framing is a 502."""

from __future__ import annotations

import http.client
import socket

import orjson
import pytest

from tests import hostile_upstream
from tests.gateway.fixtures_gateway import start_gateway

pytestmark = pytest.mark.timeout(60)


def test_content_length_with_chunked_is_dropped_and_the_client_connection_stays_in_step():
    with hostile_upstream.in_thread() as url, start_gateway(url) as gw:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        try:
            for path, rid in (("/v1/cl-te", "first"), ("/v1/cl-te", "second"), ("/v1/1xx", "third"),
                              ("/v1/ok", "fourth")):
                conn.request("POST", f"{path}?id={rid}", body=b"{}", headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
                assert resp.status == 200, (path, body[:200])
                if path != "/v1/ok":
                    assert resp.getheader("Content-Length") is None and resp.getheader("Transfer-Encoding") == "chunked"
                assert body == hostile_upstream.body_for(rid.encode()), path
            for path in hostile_upstream.PROTOCOL_ERRORS:  # refused before anything went to the client
                conn.request("POST", path.decode() + "?id=x", body=b"{}", headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
                assert resp.status == 502 and orjson.loads(body)["error"]["code"] == "protocol", (path, body)
            conn.request("POST", "/v1/ok?id=last", body=b"{}", headers={"Content-Type": "application/json"})
            assert conn.getresponse().read() == hostile_upstream.body_for(b"last")
        finally:
            conn.close()


def _raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or (not data.endswith((b"ok", b"\r\n\r\n")) and len(data) < 65536):
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(body) >= length:
                break
        return data


def test_header_bytes_that_are_not_ascii_pass_unchanged_both_ways():
    """Field values are bytes (RFC 9110 §5.5: obs-text): the gateway never decodes and re-encodes them."""
    value = b"caf\xe9 \xc3\xa9 \xff"
    with hostile_upstream.in_thread() as url, start_gateway(url) as gw:
        echo = _raw_exchange(gw.port, b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nX-Latin: %s\r\n"
                                      b"Content-Length: 2\r\nConnection: close\r\n\r\n{}" % value)
        assert echo.startswith(b"HTTP/1.1 200"), echo[:200]
        assert b"\r\nX-Latin: %s\r\n" % value in echo.partition(b"\r\n\r\n")[2] + b"\r\n"
        resp = _raw_exchange(gw.port, b"POST /v1/latin HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                      b"Connection: close\r\n\r\n{}")
        assert resp.startswith(b"HTTP/1.1 200") and b"\r\nX-Latin: %s\r\n" % value in resp, resp[:300]
