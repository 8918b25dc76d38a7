"""A real `slogate gateway` in front of an upstream with hostile HTTP/1.1 framing (tests/hostile_upstream.py):
Content-Length with chunked is never forwarded, the client connection stays in step, bad framing is a 502."""

from __future__ import annotations

import http.client

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
