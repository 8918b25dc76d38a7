"""SIGTERM with requests waiting in the admission queue, in front of a real `slogate sim`.

At the `--shutdown-grace` deadline a queued request gets the 503 JSON error `shutdown` and is
recorded; it is never admitted after the deadline (it would then be cut mid-stream, unrecorded, when
the server drops its connections 5 s later). One process and `--workers 2` (whose waiters re-check
the shared room instead of being woken).
"""

from __future__ import annotations

import asyncio
import signal

import orjson
import pytest

from tests.gateway.fixtures_gateway import metric_samples, metric_sum, start_gateway, trace_records, wait_for
from tests.gateway.test_routing_sim import SLOW, body
from tests.gateway.test_workers import new_connections, stream
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
@pytest.mark.parametrize("workers", [1, 2])
async def test_queued_requests_get_503_shutdown_at_the_grace_deadline(tmp_path, workers):
    trace_dir = tmp_path / "trace"
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    args = ["--max-inflight-requests", "1", "--queue-timeout", "60", "--shutdown-grace", "1",
            "--trace-dir", str(trace_dir), "--workers", str(workers), "--admin-listen", f"127.0.0.1:{admin_port}"]
    with start_sim(**SLOW) as sim, start_gateway(sim.url, *args, timeout=60) as gw:
        async with new_connections() as s:
            held = asyncio.create_task(stream(s, gw.url, body(400)))  # ~20 s: holds the only slot
            assert await asyncio.to_thread(
                wait_for, lambda: metric_sum(metric_samples(admin), "slogate_inflight_requests") == 1)
            queued = [asyncio.create_task(stream(s, gw.url, body(400))) for _ in range(2)]
            assert await asyncio.to_thread(
                wait_for, lambda: metric_sum(metric_samples(admin), "slogate_queue_depth") == 2)
            gw.proc.send_signal(signal.SIGTERM)
            held_result = await held
            queued_results = await asyncio.gather(*queued)
        rc = await asyncio.to_thread(gw.proc.wait, 30)
    assert rc == 0
    status, data = held_result
    assert status == 200 and b'"code":"shutdown"' in data and data.endswith(b"data: [DONE]\n\n")
    for status, data in queued_results:
        assert status == 503, (status, data[:200])
        assert orjson.loads(data)["error"]["code"] == "shutdown"
    records = trace_records(trace_dir, 3)
    assert sorted((r.status, r.error) for r in records) == [(200, "shutdown"), (503, "shutdown"), (503, "shutdown")]
    assert all(r.queue is not None and r.queue > 0 for r in records if r.status == 503)
