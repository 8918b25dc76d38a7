"""Process lifecycle: SIGTERM during streams (they finish, the trace is flushed and readable, the
process exits 0) and kill -9 while the trace is being written (segments readable up to the last
flush)."""

from __future__ import annotations

import http.client
import signal
import socket
import threading
import time

import orjson
import pytest

from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    http_request,
    metric_samples,
    metric_sum,
    start_gateway,
    wait_for,
)
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)

CHAT = "/v1/chat/completions"


def stream_body(max_tokens: int) -> bytes:
    return orjson.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                         "stream": True, "ignore_eos": True})


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_sigterm_lets_streams_finish_and_flushes_trace(tmp_path):
    trace_dir = tmp_path / "trace"
    results: list[tuple[int, bytes]] = []
    with (
        start_sim(timing="constant", ttft_ms=10, itl_ms=15, seed=1) as sim,
        start_gateway(sim.url, "--trace-dir", str(trace_dir), "--shutdown-grace", "20",
                      "--trace-flush-interval", "5") as gw,
    ):

        def client() -> None:
            status, _, raw = http_request(gw.url, "POST", CHAT, stream_body(80))
            results.append((status, raw))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        assert wait_for(lambda: metric_sum(metric_samples(sim.url), "vllm:num_requests_running") == 4, timeout=5)
        gw.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(OSError):  # no longer accepting
            socket.create_connection(("127.0.0.1", gw.port), timeout=1).close()
        for t in threads:
            t.join(20)
        assert gw.proc.wait(20) == 0
        log = gw.log_text()
    assert len(results) == 4
    for status, raw in results:
        assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
        assert raw.count(b'"content":"') - raw.count(b'"content":""') == 80
    trace = read_trace(trace_dir)
    assert len(trace.records) == 4 and not trace.truncated
    assert all(r.error is None and r.output_tokens == 80 for r in trace.records)
    assert "shutting down" in log and "4 records written" in log


def test_kill_9_leaves_readable_segments(tmp_path):
    trace_dir = tmp_path / "trace"
    stop = threading.Event()
    with (
        start_sim(timing="constant", ttft_ms=2, itl_ms=1, seed=1) as sim,
        start_gateway(sim.url, "--trace-dir", str(trace_dir), "--trace-flush-interval", "0.1") as gw,
    ):

        def load() -> None:
            while not stop.is_set():
                try:
                    http_request(gw.url, "POST", CHAT, stream_body(4), timeout=5)
                except (OSError, http.client.HTTPException):
                    return  # the gateway was killed mid-request

        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        assert wait_for(lambda: metric_sum(metric_samples(gw.admin_url), "slogate_trace_records_total",
                                           outcome="written") >= 30, timeout=15)
        written = metric_sum(metric_samples(gw.admin_url), "slogate_trace_records_total", outcome="written")
        gw.proc.kill()
        gw.proc.wait(5)
        stop.set()
        for t in threads:
            t.join(10)
    trace = read_trace(trace_dir)
    assert len(trace.records) >= written
    assert all(r.status == 200 and r.output_tokens == 4 for r in trace.records)


def test_sigterm_grace_over_ends_streams_cleanly(tmp_path):
    trace_dir = tmp_path / "trace"
    results: list[tuple[int, bytes]] = []
    with (
        start_sim(timing="constant", ttft_ms=10, itl_ms=20, seed=1) as sim,
        start_gateway(sim.url, "--trace-dir", str(trace_dir), "--shutdown-grace", "500ms") as gw,
    ):
        thread = threading.Thread(target=lambda: results.append(http_request(gw.url, "POST", CHAT, stream_body(300))[::2]))
        thread.start()
        assert wait_for(lambda: metric_sum(metric_samples(sim.url), "vllm:num_requests_running") == 1, timeout=5)
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(10) == 0
        assert time.monotonic() - t0 < 4.0
        thread.join(5)
    status, raw = results[0]
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert status == 200 and events[-1] == b"data: [DONE]"
    assert orjson.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "shutdown"
    (record,) = read_trace(trace_dir).records
    assert record.error == "shutdown" and 0 < record.output_tokens < 300
