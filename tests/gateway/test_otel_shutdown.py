"""--otel with no collector listening: the exporters retry with backoff for their whole timeout (10 s by
default), which held SIGTERM's exit 12-13 s past a 1 s --shutdown-grace. Their last batch now gets at
most 5 s (gateway.otel.bounded_shutdown), in daemon threads that never hold the interpreter's exit."""

from __future__ import annotations

import signal
import time

import aiohttp
import pytest

from tests.gateway.fixtures_gateway import start_gateway
from tests.servers import free_port
from tests.simserver import start_sim

EXPORTER_TIMEOUT_S = 10.0  # OTEL_EXPORTER_OTLP_TIMEOUT's default: how long a dead collector held the exit


@pytest.mark.slow  # about 7 s: the 5 s bound is the point
async def test_sigterm_exits_within_the_bound_when_no_collector_listens():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_METRIC_EXPORT_INTERVAL": "200"}
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, \
            start_gateway(sim.url, "--otel", "--shutdown-grace", "1", env=env) as gw:
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/chat/completions", json={
                "model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}) as r:
            assert r.status == 200  # a span and metrics the exporters now try to send
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(timeout=30)
        took = time.monotonic() - t0
    assert gw.proc.returncode == 0
    assert took < EXPORTER_TIMEOUT_S - 1.0, took  # the 5 s bound and the 1 s grace stay well under it
