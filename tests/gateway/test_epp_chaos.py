"""`slogate epp` behind the real Envoy (deploy/envoy-epp.yaml) under change and stress: the endpoint
list changing under load, request bodies over the limits, SIGTERM with streams open and requests queued.

Each test starts its own `slogate sim` replicas, EPP and Envoy (tests/bench/epp_envoy.py) and polls what
the sims, Envoy's clients and the EPP's admin port and trace show.
"""

from __future__ import annotations

import http.client
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.bench.epp_envoy import envoy_epp
from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    get_json,
    http_request,
    metric_samples,
    metric_sum,
    read_records,
    read_until_close,
    sim_running,
    trace_records,
    wait_for,
)
from tests.simserver import start_sim

pytestmark = [pytest.mark.timeout(60)]

SLOW_SIM = {"timing": "constant", "ttft_ms": 10, "itl_ms": 10}


def _chat(max_tokens: int, pad: int = 0) -> bytes:
    content = "Tell me about lighthouses." + " " * pad
    return orjson.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": content}],
                         "max_tokens": max_tokens, "stream": True, "ignore_eos": True})


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    status, _, data = http_request(url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    return status, data


def _post_cut(url: str, body: bytes) -> tuple[int, bytes]:
    """`_post` of a response that may be cut: (status, the bytes that arrived)."""
    conn = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        try:
            return resp.status, resp.read()
        except http.client.IncompleteRead as cut:
            return resp.status, cut.partial
    finally:
        conn.close()


def _in_thread(fn: Callable[[], tuple[int, bytes]], out: list) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t


def _inflight(admin: str) -> dict[str, int]:
    return {name: u["inflight_requests"] for name, u in get_json(admin + "/slogate/status")["upstreams"].items()}


def _queued(admin: str) -> int:
    return get_json(admin + "/slogate/status")["routing"]["queue_depth"].get("default", 0)


@pytest.mark.slow
def test_a_new_endpoint_list_keeps_the_load_and_queue_of_the_endpoints_that_stay(tmp_path: Path):
    """--max-inflight-requests 1 on A, which streams one request while a second waits in the queue.
    A's list grows to A, B: A still counts its stream (the admission limit holds: a third request
    waits instead of running beside it on A), the waiting request goes to B, and the time it waited
    is queue time, not EPP busy time."""
    trace = tmp_path / "capture"
    with start_sim(**SLOW_SIM) as a, start_sim(**SLOW_SIM) as b:
        name_a, name_b = a.url.removeprefix("http://"), b.url.removeprefix("http://")
        path = tmp_path / "endpoints"
        path.write_text(f"{name_a}\n")
        args = ("--endpoints-file", str(path), "--max-inflight-requests", "1", "--health-interval", "0",
                "--trace-dir", str(trace), "--trace-flush-interval", "0.2")
        with envoy_epp([], tmp_path, *args) as (envoy, epp):
            out: list[tuple[int, bytes]] = []
            threads = [_in_thread(lambda: _post(envoy.url, _chat(400)), out)]  # ~4 s on A
            assert wait_for(lambda: sim_running(a.url) == 1, timeout=10)
            threads.append(_in_thread(lambda: _post(envoy.url, _chat(150)), out))  # ~1.5 s
            assert wait_for(lambda: _queued(epp.url) == 1, timeout=10)
            path.write_text(f"{name_a}\n{name_b}\n")
            assert wait_for(lambda: sim_running(b.url) == 1, timeout=10)  # the waiting one went to B
            assert _inflight(epp.url) == {name_a: 1, name_b: 1}  # and A's stream still counts
            threads.append(_in_thread(lambda: _post(envoy.url, _chat(5)), out))
            assert wait_for(lambda: _queued(epp.url) == 1, timeout=10)  # waits for A or B: none is free
            assert sim_running(a.url) == 1
            for t in threads:
                t.join()
            assert [s for s, _ in out] == [200, 200, 200]
            assert wait_for(lambda: _inflight(epp.url) == {name_a: 0, name_b: 0}, timeout=5)
            records = trace_records(trace, 3)
    moved = next(r for r in records if r.max_tokens == 150)
    assert moved.upstream == name_b and moved.queue is not None and moved.queue > 0.5
    assert moved.overhead is not None and moved.overhead < 0.1 * moved.queue  # the wait is not EPP work


_CHUNKED_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")


def _chunks(body: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096]) for i in range(0, len(body), 4096))


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_request_bodies_over_the_limits_are_refused_and_nothing_is_held(tmp_path: Path):
    """--max-body-bytes: 413 `request_too_large` whether the size is announced or only seen arriving
    (a chunked body); --max-inflight-body-bytes: 503 `body_budget` for a body that does not fit beside
    one still uploading. Recorded and counted as the gateway does, the held bytes given back, and the
    requests within the limits go through."""
    trace = tmp_path / "capture"
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim:
        args = ("--max-body-bytes", "20000", "--max-inflight-body-bytes", "20000", "--trace-dir", str(trace),
                "--trace-flush-interval", "0.2")
        with envoy_epp([sim.url.removeprefix("http://")], tmp_path, *args) as (envoy, epp):
            big = _chat(3, pad=30000)
            status, reply = _post(envoy.url, big)
            assert status == 413, reply
            error = orjson.loads(reply)["error"]
            assert error["code"] == "request_too_large" and f"limit 20000 bytes, got {len(big)}" in error["message"]
            with _connect(envoy.url) as s:
                s.sendall(_CHUNKED_HEAD + _chunks(big) + b"0\r\n\r\n")
                chunked = read_until_close(s, 10)
            assert chunked.startswith(b"HTTP/1.1 413") and b'"request_too_large"' in chunked, chunked[:300]
            held = _chat(3, pad=15000)
            with _connect(envoy.url) as uploading:  # 12 KiB of a 15 KB body, then a pause
                uploading.sendall(_CHUNKED_HEAD + _chunks(held[:12288]))
                samples = lambda: metric_samples(epp.url)  # noqa: E731
                assert wait_for(lambda: metric_sum(samples(), "slogate_client_body_bytes_inflight") == 12288)
                status, reply = _post(envoy.url, _chat(3, pad=10000))
                assert status == 503 and orjson.loads(reply)["error"]["code"] == "body_budget", reply
                uploading.sendall(_chunks(held[12288:]) + b"0\r\n\r\n")
                assert read_until_close(uploading, 10).startswith(b"HTTP/1.1 200")
            assert _post(envoy.url, _chat(3, pad=5000))[0] == 200
            after = samples()
            assert metric_sum(after, "slogate_client_requests_rejected_total", reason="body_too_large") == 2
            assert metric_sum(after, "slogate_client_requests_rejected_total", reason="body_budget") == 1
            assert metric_sum(after, "slogate_client_body_bytes_inflight") == 0
            records = trace_records(trace, 4)
    assert sorted(str(r.error) for r in records) == ["None", "None", "request_too_large", "request_too_large"]


@pytest.mark.slow
def test_sigterm_lets_streams_finish_then_answers_the_queue_503_and_records_the_cut_as_shutdown(tmp_path: Path):
    """--shutdown-grace 1 with one stream longer than the grace and one request queued behind it:
    at the end of the grace the queued client gets the gateway's 503 `shutdown` (not Envoy's bare
    500 of a vanished EPP), and both are recorded as `shutdown`, not as client disconnects."""
    trace = tmp_path / "capture"
    with start_sim(**SLOW_SIM) as sim:
        args = ("--max-inflight-requests", "1", "--shutdown-grace", "1", "--trace-dir", str(trace),
                "--trace-flush-interval", "0.2")
        with envoy_epp([sim.url.removeprefix("http://")], tmp_path, *args) as (envoy, epp):
            out: list[tuple[int, bytes]] = []
            threads = [_in_thread(lambda: _post_cut(envoy.url, _chat(600)), out)]  # ~6 s: outlives the grace
            assert wait_for(lambda: sim_running(sim.url) == 1, timeout=10)
            threads.append(_in_thread(lambda: _post_cut(envoy.url, _chat(5)), out))
            assert wait_for(lambda: _queued(epp.url) == 1, timeout=10)
            epp.proc.send_signal(signal.SIGTERM)
            assert epp.proc.wait(10) == 0
            for t in threads:
                t.join()
            queued = next(reply for status, reply in out if not reply.startswith(b"data:"))
            assert orjson.loads(queued)["error"]["code"] == "shutdown"
            assert sorted(status for status, _ in out) == [200, 503]  # the stream was cut after its head
    records = read_records(trace)
    assert sorted((r.status, r.error) for r in records) == [(200, "shutdown"), (503, "shutdown")]
