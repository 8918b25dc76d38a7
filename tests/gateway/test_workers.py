"""`slogate gateway --workers 2` in front of real `slogate sim` servers: still one gateway outside.

Merged /metrics and /slogate/status equal the captured records; least-tokens and the admission limit
see the in-flight load of both workers; a killed worker is replaced without breaking the other's
streams; SIGTERM drains both; the two workers' trace segments read as one trace.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.gateway.fixtures_gateway import (
    get_json,
    metric_samples,
    metric_sum,
    sim_running,
    start_gateway,
    trace_records,
    wait_for,
)
from tests.gateway.test_routing_sim import SLOW, body, named, sims, start_held
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(90)
FAST = {"timing": "constant", "ttft_ms": 5, "itl_ms": 2}


def workers(upstreams, *args: str, admin: int):  # type: ignore[no-untyped-def]
    return start_gateway(upstreams, "--workers", "2", "--admin-listen", f"127.0.0.1:{admin}", *args, timeout=60)


def admin_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def both_up(admin: str) -> dict:
    """Wait until the supervisor hears from both workers; its status document."""
    doc = wait_for(lambda: (lambda d: d if d["workers"]["answering"] == 2 else None)(get_json(admin + "/slogate/status")),
                   timeout=30)
    assert doc, "both workers never answered the supervisor"
    return doc


def new_connections() -> aiohttp.ClientSession:
    """Each request on a fresh connection, so SO_REUSEPORT spreads them over the workers."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))


async def stream(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, bytes]:
    """(status, body); status 0 when the connection broke before the stream's end."""
    try:
        async with session.post(url + "/v1/chat/completions", data=data,
                                headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.read()
    except (TimeoutError, aiohttp.ClientError):
        return 0, b""


def completed(result: tuple[int, bytes]) -> bool:
    return result[0] == 200 and b"data: [DONE]" in result[1]


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_merged_metrics_and_status_equal_the_records_of_both_workers(tmp_path):
    n = 40
    trace_dir = tmp_path / "trace"
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(**FAST) as sim, workers(sim.url, "--trace-dir", str(trace_dir), "--slo", "ttft=1",
                                           admin=admin_port) as gw:
        both_up(admin)
        async with new_connections() as s:
            results = await asyncio.gather(*(stream(s, gw.url, body(8)) for _ in range(n)))
        assert all(completed(r) for r in results)
        records = trace_records(trace_dir, n)
        samples = metric_samples(admin)
        status = get_json(admin + "/slogate/status")
    assert len(records) == n
    by_worker = {p.name.split("-")[1] for p in trace_dir.glob("*.jsonl.zst")}
    assert by_worker == {"w0g0", "w1g0"}, "SO_REUSEPORT gave every connection to one worker"
    good = [r for r in records if r.error is None]
    assert metric_sum(samples, "slogate_requests_total") == n == len(good)
    assert metric_sum(samples, "gen_ai_server_time_to_first_token_seconds_count") == sum(r.ttft is not None for r in good)
    assert metric_sum(samples, "gen_ai_client_token_usage_sum", gen_ai_token_type="output") == \
        sum(r.output_tokens or 0 for r in good)
    assert metric_sum(samples, "slogate_workers") == 2
    window = status["windows"]["1m"]
    assert status["requests_total"] == n and window["requests"] == n and window["errors"] == 0
    assert window["ttft"]["count"] == n
    # The trace directory reads as one trace whose summary is the status window's.
    out = subprocess.run([sys.executable, "-m", "slogate", "trace", "stats", str(trace_dir), "--json"],
                         capture_output=True, text=True, check=True)
    stats = json.loads(out.stdout)
    assert stats["summary"]["requests"] == n
    assert stats["summary"]["ttft_s"]["p50"] == pytest.approx(window["ttft"]["p50"])
    assert stats["summary"]["ttft_s"]["p99"] == pytest.approx(window["ttft"]["p99"])


async def test_least_tokens_sees_the_load_of_both_workers():
    """One big request held open, then six small ones on fresh connections (whichever worker takes
    them): with shared in-flight tokens all six go to the other replica."""
    admin_port = free_port()
    admin = admin_url(admin_port)
    with sims(2, **SLOW) as sim, workers(named(sim.urls), "--policy", "least-tokens", admin=admin_port) as gw:
        both_up(admin)
        async with new_connections() as s:
            tasks = [await start_held(s, gw.url, body(1000))]
            first = {lab["upstream"]: v for lab, v in metric_samples(admin)["slogate_routing_decisions_total"]}
            big = max(first, key=lambda k: first[k])
            tasks += [await start_held(s, gw.url, body(100)) for _ in range(6)]
            samples = metric_samples(admin)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    got = {lab["upstream"]: v for lab, v in samples["slogate_routing_decisions_total"]}
    other = "u1" if big == "u0" else "u0"
    assert got[big] == 1 and got[other] == 6
    inflight = {lab["upstream"]: v for lab, v in samples["slogate_inflight_requests"]}
    assert inflight == {big: 1, other: 6}


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_least_tokens_sends_most_work_to_the_faster_sim():
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(timing="constant", ttft_ms=5, itl_ms=2) as fast, \
            start_sim(timing="constant", ttft_ms=5, itl_ms=40) as slow, \
            workers([f"{fast.url}#name=fast", f"{slow.url}#name=slow"], "--policy", "least-tokens",
                    admin=admin_port) as gw:
        both_up(admin)
        left = [36]
        results: list[tuple[int, bytes]] = []

        async def client(s: aiohttp.ClientSession) -> None:  # closed loop: the next request when one ends
            while left[0] > 0:
                left[0] -= 1
                results.append(await stream(s, gw.url, body(40)))

        async with new_connections() as s:  # 6 clients; a 40-token stream takes 0.1 s on fast, 1.6 s on slow
            await asyncio.gather(*(client(s) for _ in range(6)))
        got = {lab["upstream"]: v for lab, v in metric_samples(admin)["slogate_routing_decisions_total"]}
    assert len(results) == 36 and all(completed(r) for r in results)
    assert got["fast"] + got["slow"] == 36
    assert got["fast"] >= 3 * got["slow"], got


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_global_admission_limit_gives_429_exactly_beyond_the_limit():
    limit, offered = 4, 12
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(**SLOW) as sim, workers(sim.url, "--max-inflight-requests", str(limit), "--queue-size", "0",
                                           admin=admin_port) as gw:
        both_up(admin)
        async with new_connections() as s:
            results = await asyncio.gather(*(stream(s, gw.url, body(40)) for _ in range(offered)))
        samples = metric_samples(admin)
    statuses = sorted(r[0] for r in results)
    assert statuses == [200] * limit + [429] * (offered - limit)
    assert metric_sum(samples, "slogate_rejections_total", reason="queue_full") == offered - limit


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_queued_requests_get_the_room_another_worker_frees():
    """Limit 2, queue 6: eight requests at once all finish (waiters re-check the shared room, so a
    release in one worker lets another worker's waiter in); never more than 2 reach the sim."""
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(timing="constant", ttft_ms=5, itl_ms=20) as sim, \
            workers(sim.url, "--max-inflight-requests", "2", "--queue-size", "6", "--queue-timeout", "20",
                    admin=admin_port) as gw:
        both_up(admin)
        peak = [0.0]

        async def watch() -> None:
            while True:
                peak[0] = max(peak[0], await asyncio.to_thread(sim_running, sim.url))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        async with new_connections() as s:
            results = await asyncio.gather(*(stream(s, gw.url, body(10)) for _ in range(8)))
        watcher.cancel()
        samples = metric_samples(admin)
    assert all(completed(r) for r in results), [r[0] for r in results]
    assert peak[0] <= 2
    assert metric_sum(samples, "slogate_queue_seconds_count") == 8


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_killed_worker_is_replaced_and_the_other_workers_streams_finish():
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(**SLOW) as sim, workers(sim.url, "--max-inflight-requests", "100", admin=admin_port) as gw:
        pids = both_up(admin)["workers"]["pids"]
        async with new_connections() as s:
            before = await asyncio.gather(*(stream(s, gw.url, body(2)) for _ in range(10)))
            assert all(completed(r) for r in before)
            assert (await asyncio.to_thread(get_json, admin + "/slogate/status"))["requests_total"] == 10
            tasks = [asyncio.create_task(stream(s, gw.url, body(60))) for _ in range(12)]
            assert await asyncio.to_thread(
                wait_for, lambda: metric_sum(metric_samples(admin), "slogate_inflight_requests") == 12)
            os.kill(pids[0], signal.SIGKILL)
            results = await asyncio.gather(*tasks)
            doc = await asyncio.to_thread(both_up, admin)
            after = await stream(s, gw.url, body(5))
        samples = metric_samples(admin)
        status = get_json(admin + "/slogate/status")
    broken = sum(not completed(r) for r in results)
    assert broken + sum(completed(r) for r in results) == 12
    assert 0 < broken < 12, "SO_REUSEPORT gave every connection to one worker"
    assert doc["workers"]["restarts"] == 1 and doc["workers"]["lost_requests"] == broken
    assert doc["workers"]["pids"][0] not in (None, pids[0]) and doc["workers"]["pids"][1] == pids[1]
    assert metric_sum(samples, "slogate_worker_lost_requests_total") == broken
    # The dead worker's counts stay in the totals (a total that went down would read as a reset).
    assert metric_sum(samples, "slogate_requests_total") == 10 + (12 - broken) + 1
    assert status["requests_total"] == status["windows"]["1m"]["requests"] == 10 + (12 - broken) + 1
    assert completed(after)


class HealthProbes:
    """A real HTTP upstream that only answers `GET /health` (200, or 503 once `healthy` is False) and
    `GET /metrics` (a vLLM page: `waiting` requests waiting) and notes when each probe came: no LLM
    endpoint, so a request routed to it fails."""

    def __init__(self, waiting: int = 0) -> None:
        self.at: list[float] = []
        self.scraped: list[float] = []
        self.healthy = True
        self.waiting = waiting
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def _health(self, request: web.Request) -> web.Response:
        self.at.append(time.monotonic())
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scraped.append(time.monotonic())
        return web.Response(text=f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {self.waiting}\n"
                                 "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.9\n")

    async def __aenter__(self) -> HealthProbes:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    async def wait_probes(self, n: int, timeout: float = 20.0, scrapes: bool = False) -> None:
        seen = self.scraped if scrapes else self.at
        end = time.monotonic() + timeout
        while len(seen) < n:
            assert time.monotonic() < end, f"{len(seen)} probes, waited for {n}"
            await asyncio.sleep(0.01)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_one_health_checker_for_all_workers_and_a_restart_keeps_its_verdict():
    """Active checks run in worker 0 alone: probes come one per interval, not one per worker (a
    checker sleeps an interval between rounds, so 20 probes from one take >= 19 intervals; from two,
    about half that). Both workers route by the shared verdict, and worker 0's replacement keeps it:
    the upstream never reads as healthy again while its probes fail."""
    interval = 0.1
    admin_port = free_port()
    admin = admin_url(admin_port)
    async with HealthProbes() as flaky:
        with start_sim(**FAST) as sim, \
                workers([f"{sim.url}#name=good", f"{flaky.url}#name=flaky"], "--policy", "round-robin",
                        "--health-interval", str(interval), admin=admin_port) as gw:
            pids = (await asyncio.to_thread(both_up, admin))["workers"]["pids"]
            first = len(flaky.at)
            await flaky.wait_probes(first + 20)
            span = flaky.at[first + 19] - flaky.at[first]
            assert span >= 19 * interval * 0.97, f"20 probes in {span:.2f} s: more than one checker"

            def flaky_healthy() -> float:
                return metric_sum(metric_samples(admin), "slogate_upstream_healthy", upstream="flaky")

            flaky.healthy = False  # the merged gauge is the largest of the workers': 0 when every worker says so
            assert await asyncio.to_thread(wait_for, lambda: flaky_healthy() == 0)
            async with new_connections() as s:  # spread over both workers: none goes to flaky
                results = await asyncio.gather(*(stream(s, gw.url, body(2)) for _ in range(20)))
            assert all(completed(r) for r in results), [r[0] for r in results]

            os.kill(pids[0], signal.SIGKILL)  # the checker
            seen = []
            while True:  # until the replacement answers and probes: the verdict never flips back
                seen.append(await asyncio.to_thread(flaky_healthy))
                doc = await asyncio.to_thread(get_json, admin + "/slogate/status")
                if doc["workers"]["answering"] == 2 and doc["workers"]["pids"][0] != pids[0]:
                    break
            replaced = len(flaky.at)
            await flaky.wait_probes(replaced + 3)  # the new worker 0 checks
            seen.append(await asyncio.to_thread(flaky_healthy))
            assert seen and max(seen) == 0, seen
            async with new_connections() as s:
                results = await asyncio.gather(*(stream(s, gw.url, body(2)) for _ in range(10)))
            assert all(completed(r) for r in results), [r[0] for r in results]


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_one_scraper_for_all_workers_and_both_route_by_its_figures(tmp_path):
    """`--scrape-upstream-metrics` with --workers 2: worker 0 alone scrapes (20 scrapes take >= 19
    intervals), and both workers route by what it read. The busy upstream reports 50 requests
    waiting and cannot serve a chat: requests spread over both workers on fresh connections all
    finish, so neither worker sent one there (without the shared figures, worker 1 would see no
    scraped load and least-tokens would send it half of them)."""
    interval = 0.1
    admin_port = free_port()
    admin = admin_url(admin_port)
    config = tmp_path / "gateway.toml"
    config.write_text(f"[routing]\nscrape_interval = {interval}\n")
    async with HealthProbes(waiting=50) as busy:
        with start_sim(**FAST) as sim, \
                workers([f"{sim.url}#name=good", f"{busy.url}#name=busy"], "--scrape-upstream-metrics",
                        "--config", str(config), "--health-interval", "0", admin=admin_port) as gw:
            await asyncio.to_thread(both_up, admin)
            first = len(busy.scraped)
            await busy.wait_probes(first + 20, scrapes=True)
            span = busy.scraped[first + 19] - busy.scraped[first]
            assert span >= 19 * interval * 0.97, f"20 scrapes in {span:.2f} s: more than one scraper"
            async with new_connections() as s:
                results = await asyncio.gather(*(stream(s, gw.url, body(2)) for _ in range(20)))
            samples = metric_samples(admin)
    assert all(completed(r) for r in results), [r[0] for r in results]
    assert metric_sum(samples, "slogate_routing_decisions_total", upstream="good") == 20
    assert metric_sum(samples, "slogate_routing_decisions_total", upstream="busy") == 0


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_sigterm_drains_every_worker(tmp_path):
    admin_port = free_port()
    admin = admin_url(admin_port)
    trace_dir = tmp_path / "trace"
    with start_sim(**SLOW) as sim, workers(sim.url, "--trace-dir", str(trace_dir), admin=admin_port) as gw:
        both_up(admin)
        async with new_connections() as s:
            tasks = [asyncio.create_task(stream(s, gw.url, body(40))) for _ in range(8)]
            assert await asyncio.to_thread(
                wait_for, lambda: metric_sum(metric_samples(admin), "slogate_inflight_requests") == 8)
            gw.proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*tasks)
        rc = await asyncio.to_thread(gw.proc.wait, 30)
    assert rc == 0
    assert all(completed(r) for r in results)
    records = trace_records(trace_dir, 8)
    assert len(records) == 8 and all(r.error is None for r in records)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_workers_stop_when_the_supervisor_is_killed():
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(**FAST) as sim, workers(sim.url, admin=admin_port) as gw:
        pids = both_up(admin)["workers"]["pids"]
        gw.proc.kill()
        gw.proc.wait(10)

        def gone() -> bool:
            for pid in pids:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    continue
                return False
            return True

        assert await asyncio.to_thread(wait_for, gone, 20), "a worker outlived its supervisor"
    assert not [p for p in Path("/dev/shm").glob("slogate-workers-*") if (p / "worker-0.json").exists()
                and str(admin_port) in (p / "worker-0.json").read_text()], "runtime directory left behind"


# ------------------------------------------------------------------ configuration and merging (no servers)
def test_workers_config_values():
    from slogate.gateway.config import build_config, worker_count
    from slogate.traces.usage import UsageError

    base = {"upstreams": ["http://127.0.0.1:9"], "admin_listen": "127.0.0.1:9091"}
    assert worker_count(build_config(base)) == 1
    assert worker_count(build_config({**base, "workers": 3})) == 3
    assert worker_count(build_config({**base, "workers": "auto"})) == len(os.sched_getaffinity(0))
    for bad in (0, -1, "many", True):
        with pytest.raises(UsageError, match=r"gateway\.workers \(--workers\)"):
            build_config({**base, "workers": bad})
    with pytest.raises(UsageError, match="needs its own admin_listen"):
        build_config({"upstreams": ["http://127.0.0.1:9"], "workers": 2, "admin_listen": "proxy"})


def test_workers_with_admin_on_the_proxy_port_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "slogate", "gateway", "--upstream", "http://127.0.0.1:9",
                          "--workers", "2", "--admin-listen", "proxy"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--admin-listen" in out.stderr and "not proxy" in out.stderr


def test_merge_sums_counters_and_histograms_and_keeps_shared_gauges():
    from slogate.gateway.admin_merge import merge_metrics, parse

    one = parse('# TYPE slogate_requests counter\nslogate_requests_total{upstream="a"} 2\n'
                '# TYPE slogate_inflight_requests gauge\nslogate_inflight_requests{upstream="a"} 5\n'
                '# TYPE slogate_queue_depth gauge\nslogate_queue_depth{pool="default"} 1\n'
                '# TYPE h histogram\nh_bucket{le="1.0"} 1\nh_bucket{le="+Inf"} 2\nh_sum 0.5\nh_count 2\n')
    two = parse('# TYPE slogate_requests counter\nslogate_requests_total{upstream="a"} 3\n'
                'slogate_requests_total{upstream="b"} 1\n'
                '# TYPE slogate_inflight_requests gauge\nslogate_inflight_requests{upstream="a"} 5\n'
                '# TYPE slogate_queue_depth gauge\nslogate_queue_depth{pool="default"} 2\n'
                '# TYPE h histogram\nh_bucket{le="1.0"} 0\nh_bucket{le="+Inf"} 1\nh_sum 2\nh_count 1\n')
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in merge_metrics([one, two]) for s in f.samples}
    assert got[("slogate_requests_total", (("upstream", "a"),))] == 5
    assert got[("slogate_requests_total", (("upstream", "b"),))] == 1
    assert got[("slogate_inflight_requests", (("upstream", "a"),))] == 5  # read from the shared state by each worker
    assert got[("slogate_queue_depth", (("pool", "default"),))] == 3
    assert got[("h_bucket", (("le", "+Inf"),))] == 3 and got[("h_sum", ())] == 2.5 and got[("h_count", ())] == 3



def test_merge_keeps_per_process_gauges_meaningful():
    """prometheus_client's process_* series: the oldest start time, the largest fd limit; memory,
    open fds and CPU seconds are the workers' totals (never a start time in the future)."""
    from slogate.gateway.admin_merge import merge_metrics, parse

    def exposition(start: float, rss: float, fds: float, cpu: float) -> list:
        return parse(f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {start}\n"
                     f"# TYPE process_max_fds gauge\nprocess_max_fds 1024\n"
                     f"# TYPE process_open_fds gauge\nprocess_open_fds {fds}\n"
                     f"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {rss}\n"
                     f"# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total {cpu}\n")

    merged = merge_metrics([exposition(1.7e9 + 5, 100, 20, 1.5), exposition(1.7e9, 300, 30, 2.0)])
    got = {s.name: s.value for f in merged for s in f.samples}
    assert got["process_start_time_seconds"] == 1.7e9  # the oldest worker
    assert got["process_max_fds"] == 1024  # a per-process limit
    assert got["process_open_fds"] == 50 and got["process_resident_memory_bytes"] == 400
    assert got["process_cpu_seconds_total"] == 3.5


def test_merged_process_metrics_of_two_workers():
    """The real `--workers 2` exposition: process_start_time_seconds is the oldest worker's (not the
    sum, a date decades ahead) and process_max_fds the workers' limit (not twice it)."""
    from prometheus_client import ProcessCollector

    before = time.time()
    admin_port = free_port()
    admin = admin_url(admin_port)
    with start_sim(**FAST) as sim, workers(sim.url, admin=admin_port):
        pids = both_up(admin)["workers"]["pids"]
        samples = metric_samples(admin)
        own = [{s.name: s.value for f in ProcessCollector(pid=lambda p=pid: p, registry=None).collect()
                for s in f.samples} for pid in pids]
    assert len(own) == 2
    start = metric_sum(samples, "process_start_time_seconds")
    assert start == min(o["process_start_time_seconds"] for o in own)
    assert before - 5 <= start <= time.time()
    assert metric_sum(samples, "process_max_fds") == max(o["process_max_fds"] for o in own)
    assert metric_sum(samples, "process_open_fds") > max(o["process_open_fds"] for o in own)  # summed

async def test_a_waiter_can_wait_again_with_its_place():
    """Worker waiters re-check every 5 ms with the same seq (their place in the queue)."""
    from slogate.gateway.routing.admission import AdmissionQueue

    q = AdmissionQueue(4)
    first = q.next_seq()
    assert not await q.wait(0, first, 0.01)
    later = asyncio.create_task(q.wait(0, q.next_seq(), 5))
    await asyncio.sleep(0)
    again = asyncio.create_task(q.wait(0, first, 5))  # the same (priority, seq) as a cancelled entry
    await asyncio.sleep(0)
    assert q.depth == 2 and q.wake()
    assert await again and not later.done()  # kept its place ahead of the later arrival
    assert q.wake() and await later
