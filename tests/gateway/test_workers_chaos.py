"""`slogate gateway --workers 2` under chaos, in front of real `slogate sim` servers.

A worker killed while it holds requests in its admission queue: those clients' connections break
with it, and the supervisor counts them in `slogate_worker_lost_requests_total` beside the streams
it was relaying.
"""

from __future__ import annotations

import asyncio
import os
import signal

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.fixtures_gateway import get_json, http_request, metric_samples, metric_sum, wait_for
from tests.gateway.test_routing_sim import SLOW, body
from tests.gateway.test_workers import admin_url, both_up, new_connections, stream, workers
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_killed_worker_counts_its_queued_requests_as_lost():
    """One slot for the gateway, held by a ~20 s stream; 10 more requests on fresh connections
    queue in both workers (SO_REUSEPORT spreads them: all on worker 1 has odds 1/1024). Worker 0
    is killed: every client whose connection broke is counted lost, queued ones included."""
    admin_port = free_port()
    admin = admin_url(admin_port)
    queued_n = 10
    with start_sim(**SLOW) as sim, workers(sim.url, "--max-inflight-requests", "1", "--queue-timeout", "60",
                                           admin=admin_port) as gw:
        pids = (await asyncio.to_thread(both_up, admin))["workers"]["pids"]
        async with new_connections() as s:
            tasks = [asyncio.create_task(stream(s, gw.url, body(400)))]
            assert await asyncio.to_thread(
                wait_for, lambda: metric_sum(metric_samples(admin), "slogate_inflight_requests") == 1)
            tasks += [asyncio.create_task(stream(s, gw.url, body(400))) for _ in range(queued_n)]
            assert await asyncio.to_thread(
                wait_for, lambda: metric_sum(metric_samples(admin), "slogate_queue_depth") == queued_n)
            os.kill(pids[0], signal.SIGKILL)

            def settled() -> dict | None:
                doc = get_json(admin + "/slogate/status")["workers"]
                return doc if doc["restarts"] == 1 and doc["answering"] == 2 else None

            doc = await asyncio.to_thread(wait_for, settled, 20)
            assert doc, "worker 0 was not replaced"
            broken = [t for t in tasks if t.done() and t.result()[0] == 0]
            lost = metric_sum(metric_samples(admin), "slogate_worker_lost_requests_total")
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert broken, "worker 0 held none of the requests (SO_REUSEPORT put all 11 on worker 1)"
    assert doc["lost_requests"] == lost == len(broken)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_status_ejections_are_the_sum_over_workers(tmp_path):
    """A dead upstream beside a good one: every worker that sends it a request ejects it (a connect
    error; the request is retried on the good one). /slogate/status's `ejections` per upstream is the
    gateway's count, the same as the summed `slogate_ejections_total`, not worker 0's share."""
    admin_port = free_port()
    admin = admin_url(admin_port)
    config = tmp_path / "gateway.toml"
    config.write_text("[routing]\npolicy = \"round-robin\"\n[routing.health]\ninterval = 0\n"
                      "eject_base = 0.02\neject_max = 0.05\n")
    dead = f"http://127.0.0.1:{free_port()}#name=dead"
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            workers([f"{sim.url}#name=good", dead], "--config", str(config), admin=admin_port) as gw:
        await asyncio.to_thread(both_up, admin)

        def ejections() -> float:
            return metric_sum(metric_samples(admin), "slogate_ejections_total", upstream="dead")

        async with new_connections() as s:
            while await asyncio.to_thread(ejections) < 10:  # by both workers (all by one: odds 1/1024)
                results = await asyncio.gather(*(stream(s, gw.url, body(2)) for _ in range(10)))
                assert all(r[0] == 200 for r in results), [r[0] for r in results]
                await asyncio.sleep(0.05)  # the ejection (at most 0.05 s) ends: the next batch tries it again
        counted = await asyncio.to_thread(ejections)
        status = await asyncio.to_thread(get_json, admin + "/slogate/status")
    by_name = {u["name"]: u["ejections"] for u in status["routing"]["upstreams"]}
    assert by_name == {"good": 0, "dead": counted}


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_a_silent_worker_keeps_its_counts_in_the_totals():
    """A worker that does not answer the supervisor (SIGSTOP here; likewise one killed but not yet
    reaped) keeps its last counts in the merged /metrics and /slogate/status: the totals never go
    down (Prometheus would read a counter reset, and rate() a burst of requests)."""
    n = 20
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, workers(sim.url, admin=admin_port) as gw:
        pids = (await asyncio.to_thread(both_up, admin))["workers"]["pids"]
        async with new_connections() as s:
            results = await asyncio.gather(*(stream(s, gw.url, body(2)) for _ in range(n)))
        assert all(r[0] == 200 for r in results)
        before = metric_sum(metric_samples(admin), "slogate_requests_total")
        assert before == n and get_json(admin + "/slogate/status")["requests_total"] == n
        os.kill(pids[0], signal.SIGSTOP)
        try:  # both asked at once: each waits out the stopped worker's answer (5 s)
            (_, _, text), (_, _, doc) = await asyncio.gather(
                asyncio.to_thread(http_request, admin, "GET", "/metrics", timeout=20),
                asyncio.to_thread(http_request, admin, "GET", "/slogate/status", timeout=20))
        finally:
            os.kill(pids[0], signal.SIGCONT)
    status = orjson.loads(doc)
    assert status["workers"]["answering"] == 1
    assert sum(s.value for fam in text_string_to_metric_families(text.decode()) for s in fam.samples
               if s.name == "slogate_requests_total") == n
    assert status["requests_total"] == status["windows"]["1m"]["requests"] == n
