"""Fault behaviour with the simulator's fault injection (`x-slogate-fault` header), real sockets only.

Upstream refused → 502 JSON fast; reset mid-stream → error event + [DONE]; stall past the idle
timeout → error event; hang past the first-byte timeout → 504 JSON; client disconnect (or half-close) → the
upstream request is aborted (the simulator's running count drops to 0); oversized body → 413;
malformed JSON → relayed, the upstream's 400 reaches the client and is recorded. After every fault
the gateway still serves normal requests.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import openai
import orjson
import pytest

from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    http_request,
    metric_samples,
    metric_sum,
    read_records,
    read_until_close,
    sim_running,
    start_gateway,
    trace_records,
    wait_for,
)
from tests.servers import Server, free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)

CHAT = "/v1/chat/completions"


def body(max_tokens: int = 8, stream: bool = True, **extra) -> bytes:
    return orjson.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                         "stream": stream, "ignore_eos": True, **extra})


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[Server, Server, object]]:
    trace_dir = tmp_path_factory.mktemp("faults-trace")
    with (
        start_sim(timing="constant", ttft_ms=10, itl_ms=10, seed=1) as sim,
        start_gateway(sim.url, "--idle-timeout", "400ms", "--ttfb-timeout", "700ms", "--max-body-bytes", "65536",
                      "--trace-dir", str(trace_dir), "--trace-flush-interval", "0.2") as gw,
    ):
        yield sim, gw, trace_dir


def assert_serves(gw: Server) -> None:
    status, _, raw = http_request(gw.url, "POST", CHAT, body(3), {"Content-Type": "application/json"})
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]


def test_upstream_refused_is_a_fast_502_json():
    dead = f"http://127.0.0.1:{free_port()}"
    with start_gateway(dead, "--connect-timeout", "2") as gw:
        t0 = time.monotonic()
        status, headers, raw = http_request(gw.url, "POST", CHAT, body(), {"Content-Type": "application/json"})
        assert time.monotonic() - t0 < 2.0
        assert status == 502 and headers["Content-Type"].startswith("application/json")
        err = orjson.loads(raw)["error"]
        assert err["code"] == "connect" and err["param"] is None and err["type"] and err["message"]
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.APIStatusError) as exc:
            client.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "x"}])
        assert exc.value.status_code == 502
        assert http_request(gw.url, "GET", "/readyz")[0] == 200  # the session is up; the upstream is down


def test_reset_mid_stream_gives_error_event_then_done(setup):
    _sim, gw, _ = setup
    status, _, raw = http_request(gw.url, "POST", CHAT, body(20), {"x-slogate-fault": "reset_after=3"})
    assert status == 200
    evs = events(raw)
    assert evs[-1] == b"data: [DONE]"
    err = orjson.loads(evs[-2].removeprefix(b"data: "))["error"]
    assert err["code"] == "reset"
    assert sum(b'"content":"' in e and b'"content":""' not in e for e in evs) == 3
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "x"}],
                                                max_tokens=20, stream=True,
                                                extra_headers={"x-slogate-fault": "reset_after=2"}):
            pass
    assert_serves(gw)


def test_stall_past_idle_timeout_gives_error_event(setup):
    sim, gw, _ = setup
    t0 = time.monotonic()
    status, _, raw = http_request(gw.url, "POST", CHAT, body(10), {"x-slogate-fault": "stall_ms=3000,stall_after=2"})
    assert time.monotonic() - t0 < 2.5
    evs = events(raw)
    assert status == 200 and evs[-1] == b"data: [DONE]"
    assert orjson.loads(evs[-2].removeprefix(b"data: "))["error"]["code"] == "timeout_idle"
    assert wait_for(lambda: sim_running(sim.url) == 0, timeout=5)  # the stalled request was aborted
    assert_serves(gw)


def test_hang_past_first_byte_timeout_gives_504_json(setup):
    _sim, gw, _ = setup
    t0 = time.monotonic()
    status, _, raw = http_request(gw.url, "POST", CHAT, body(5), {"x-slogate-fault": "hang"})
    assert 0.6 < time.monotonic() - t0 < 3.0
    assert status == 504 and orjson.loads(raw)["error"]["code"] == "timeout_ttfb"
    assert_serves(gw)


def test_client_disconnect_aborts_upstream_request(setup):
    sim, gw, _ = setup
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", CHAT, body=body(3000), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert b"data:" in resp.read(300)
    assert sim_running(sim.url) == 1
    resp.close()
    conn.close()
    assert wait_for(lambda: sim_running(sim.url) == 0, timeout=5), "upstream request kept running"
    assert_serves(gw)


def test_client_half_close_is_a_disconnect(setup):
    """A client that half-closes (its FIN right after the request) is gone, as nginx takes it (499): the
    stream is aborted, the upstream request too, and the record says client_disconnect."""
    sim, gw, trace_dir = setup

    def disconnects() -> int:
        return sum(r.status == 499 and r.error == "client_disconnect" for r in read_records(trace_dir))

    host, port = gw.url.removeprefix("http://").split(":")

    def half_closed(wire: bytes) -> bytes:  # what the gateway writes before it closes
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(wire)
            s.shutdown(socket.SHUT_WR)
            return read_until_close(s, 10)  # a 3,000-token stream would take 30 s

    def chat(max_tokens: int) -> bytes:
        payload = body(max_tokens)
        return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (CHAT.encode(), len(payload)) + payload

    before = disconnects()
    raw = half_closed(chat(3000))
    assert b"[DONE]" not in raw, raw[-200:]
    assert wait_for(lambda: disconnects() == before + 1, timeout=5), (before, disconnects())
    assert wait_for(lambda: sim_running(sim.url) == 0, timeout=5), "upstream request kept running"
    # requests pipelined before the FIN are answered first (reading waits while one is relayed)
    raw = half_closed(chat(3) + chat(3))
    assert raw.count(b"HTTP/1.1 200") == 2 and raw.count(b"data: [DONE]") == 2, raw[-300:]
    assert_serves(gw)


def test_oversized_body_is_413(setup):
    _sim, gw, _ = setup
    big = orjson.dumps({"model": SIM_MODEL, "prompt": "x" * 100_000, "max_tokens": 1})
    status, _, raw = http_request(gw.url, "POST", "/v1/completions", big, {"Content-Type": "application/json"})
    assert status == 413 and orjson.loads(raw)["error"]["code"] == "request_too_large"
    # without Content-Length (chunked upload) the limit holds too
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/completions", body=iter([big[:50_000], big[50_000:]]), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    assert_serves(gw)


def test_malformed_json_is_relayed_and_recorded(setup):
    sim, gw, trace_dir = setup
    bad = b'{"model": "llama-3-8b", "messages": [oops'
    direct = http_request(sim.url, "POST", CHAT, bad, {"Content-Type": "application/json"})
    via = http_request(gw.url, "POST", CHAT, bad, {"Content-Type": "application/json"})
    assert via[0] == direct[0] == 400 and via[2] == direct[2]
    assert_serves(gw)
    records = wait_for(lambda: [r for r in trace_records(trace_dir, 1) if r.status == 400], timeout=5)
    assert records and records[0].error == "upstream_status" and records[0].model is None


def test_upstream_error_status_is_relayed(setup):
    _sim, gw, _ = setup
    status, _, raw = http_request(gw.url, "POST", CHAT, body(), {"x-slogate-fault": "error=503"})
    assert status == 503 and b"error" in raw
    samples = metric_samples(gw.admin_url)
    assert metric_sum(samples, "slogate_requests_total", status_class="5xx") >= 1
    assert metric_sum(samples, "slogate_inflight_requests") == 0


def test_expect_100_continue_is_answered(setup):
    _sim, gw, _ = setup
    payload = body(2, stream=False)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n")
        sock.settimeout(0.5)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")  # not after the client's 1 s fallback
        sock.sendall(payload)
        sock.settimeout(5)
        reply = b""
        while b'"finish_reason"' not in reply:
            data = sock.recv(65536)
            assert data, reply
            reply += data
        assert reply.startswith(b"HTTP/1.1 200")
