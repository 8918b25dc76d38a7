"""Routing through the real gateway to several real `slogate sim` replicas over HTTP.

Each policy's choice under controlled load, pools, ejection and return of a killed replica with no
loss of requests that had not started streaming, 503 retries, admission queue, 429 and priorities.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence

import aiohttp
import orjson
import pytest

from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    get_json,
    http_request,
    metric_samples,
    metric_sum,
    start_gateway,
    trace_records,
    wait_for,
)
from tests.servers import free_ports
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)
SLOW = {"timing": "constant", "ttft_ms": 10, "itl_ms": 50}  # a 100-token answer streams for ~5 s


def sims(replicas: int, **kwargs):  # type: ignore[no-untyped-def]
    """`start_sim(replicas=N)` on N consecutive ports that servers can bind (SO_REUSEADDR), so ports
    left in TIME_WAIT by other tests do not make the search fail on a busy machine."""
    return start_sim(replicas=replicas, port=free_ports(replicas), **kwargs)


def named(urls: Sequence[str], *options: str) -> list[str]:
    """`URL#name=u0[,options]` for each URL (options per position, may be empty)."""
    out = []
    for i, url in enumerate(urls):
        extra = options[i] if i < len(options) and options[i] else ""
        out.append(f"{url}#name=u{i}" + (f",{extra}" if extra else ""))
    return out


def body(max_tokens: int = 100, prompt: str = "hello there", stream: bool = True) -> bytes:
    return orjson.dumps({"model": SIM_MODEL, "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
                         "messages": [{"role": "user", "content": prompt}]})


def decisions(admin_url: str) -> dict[str, float]:
    samples = metric_samples(admin_url)
    return {lab["upstream"]: v for lab, v in samples.get("slogate_routing_decisions_total", [])}


async def hold(session: aiohttp.ClientSession, url: str, data: bytes, started: asyncio.Event | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request; sets `started` at the first body byte; returns (status, body)."""
    async with session.post(url + "/v1/chat/completions", data=data,
                            headers={"Content-Type": "application/json", **(headers or {})}) as resp:
        chunks = []
        async for piece in resp.content.iter_any():
            if started is not None:
                started.set()
            chunks.append(piece)
        return resp.status, b"".join(chunks)


async def start_held(session: aiohttp.ClientSession, url: str, data: bytes) -> asyncio.Task:
    """Start a streaming request and return once its first bytes arrived (it stays in flight)."""
    started = asyncio.Event()
    task = asyncio.create_task(hold(session, url, data, started))
    await asyncio.wait_for(started.wait(), 10)
    return task


async def until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Like wait_for, but lets this test's own requests run meanwhile."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def cancel_all(tasks: Sequence[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ------------------------------------------------------------------ policies
@pytest.mark.parametrize("policy, expect", [("least-tokens", {"u0": 1, "u1": 3}),
                                            ("least-requests", {"u0": 2, "u1": 2}),
                                            ("power-of-two", {"u0": 1, "u1": 3})])
async def test_policy_choice_under_controlled_load(policy, expect):
    """One big request (1000 tokens) on one replica, then three small ones (100 tokens) held open:
    token-aware policies stack the small ones on the other replica, least-requests balances counts."""
    with sims(2, **SLOW) as sim, start_gateway(named(sim.urls), "--policy", policy) as gw:
        async with aiohttp.ClientSession() as s:
            tasks = [await start_held(s, gw.url, body(1000))]
            big = max(decisions(gw.admin_url).items(), key=lambda kv: kv[1])[0]
            for _ in range(3):
                tasks.append(await start_held(s, gw.url, body(100)))
            got = decisions(gw.admin_url)
            status = get_json(gw.admin_url + "/slogate/status")["routing"]
            await cancel_all(tasks)
    other = "u1" if big == "u0" else "u0"
    assert {"u0": got.get(big, 0), "u1": got.get(other, 0)} == expect
    assert status["policy"] == policy
    reasons = {u["name"]: u["last_reason"] for u in status["upstreams"]}
    assert any(r.startswith(f"chosen ({policy})") for r in reasons.values())


async def test_weighted_round_robin_and_status():
    with sims(3, timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            start_gateway(named(sim.urls, "weight=2"), "--policy", "round-robin") as gw:
        for _ in range(8):
            status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions", body(4, stream=False),
                                        {"Content-Type": "application/json"})
            assert status == 200
        assert decisions(gw.admin_url) == {"u0": 4, "u1": 2, "u2": 2}
        up = get_json(gw.admin_url + "/slogate/status")["routing"]["upstreams"]
        assert [u["weight"] for u in up] == [2.0, 1.0, 1.0] and all(u["inflight_requests"] == 0 for u in up)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_prefix_affinity_sticky_and_bounded():
    with sims(3, **SLOW) as sim, start_gateway(named(sim.urls), "--policy", "prefix-affinity") as gw:
        owners: dict[int, set[str]] = {}
        for rep in range(3):
            for p in range(4):
                before = decisions(gw.admin_url)
                status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions",
                                            body(2, prompt=f"system prompt number {p} " * 60 + f"turn {rep}",
                                                 stream=False), {"Content-Type": "application/json"})
                assert status == 200
                after = decisions(gw.admin_url)
                owners.setdefault(p, set()).update(k for k in after if after[k] != before.get(k, 0))
        assert all(len(v) == 1 for v in owners.values()), owners  # each prefix always on one replica
        # Bounded load: many concurrent requests sharing one hot prefix spread beyond its owner.
        before = decisions(gw.admin_url)
        async with aiohttp.ClientSession() as s:
            tasks = [await start_held(s, gw.url, body(100, prompt="hot prefix " * 200)) for _ in range(9)]
            after = decisions(gw.admin_url)
            await cancel_all(tasks)
        used = [k for k in after if after[k] > before.get(k, 0)]
        assert len(used) >= 2, after


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_scraped_engine_load_corrects_least_tokens():
    """Load the gateway cannot see (sent straight to replica u0) shows in u0's vllm:num_requests_waiting;
    with --scrape-upstream-metrics every new request avoids u0."""
    with sims(2, max_num_seqs=1) as sim, \
            start_gateway(named(sim.urls), "--scrape-upstream-metrics", "--health-interval", "0") as gw:
        async with aiohttp.ClientSession() as s:
            direct = [asyncio.create_task(hold(s, sim.urls[0], body(400))) for _ in range(4)]

            def waiting() -> bool:
                u0 = get_json(gw.admin_url + "/slogate/status")["routing"]["upstreams"][0]
                return bool(u0["scraped"] and u0["scraped"]["waiting"] >= 2)

            assert await until(waiting)
            for _ in range(4):
                status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions", body(2, stream=False),
                                            {"Content-Type": "application/json"})
                assert status == 200
            got = decisions(gw.admin_url)
            await cancel_all(direct)
    assert got == {"u1": 4}


# ---------------------------------------------------------------------- pools
@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_pool_rules_route_long_and_short_and_readiness():
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as short, \
            start_sim(timing="constant", ttft_ms=1, itl_ms=1) as long, \
            start_gateway([f"{short.url}#name=short", f"{long.url}#name=long,pool=long"],
                          "--pool", "long: prompt_tokens >= 1000 or max_tokens >= 500",
                          "--health-interval", "0.2") as gw:
        cases = [("x" * 100, 10, "short"), ("x" * 5000, 10, "long"), ("x" * 100, 600, "long"), ("x" * 3000, 499, "short")]
        for prompt, max_tokens, where in cases:
            before = decisions(gw.admin_url)
            status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions",
                                        body(max_tokens, prompt=prompt, stream=False),
                                        {"Content-Type": "application/json"})
            assert status == 200
            after = decisions(gw.admin_url)
            assert [k for k in after if after[k] != before.get(k, 0)] == [where], (prompt[:10], max_tokens)
        samples = metric_samples(gw.admin_url)
        assert metric_sum(samples, "slogate_routing_decisions_total", pool="long") == 2
        assert http_request(gw.url, "GET", "/readyz")[0] == 200
        long.stop(signal.SIGKILL)
        assert wait_for(lambda: http_request(gw.url, "GET", "/readyz")[0] == 503, timeout=10)
        status = get_json(gw.admin_url + "/slogate/status")["routing"]
        assert status["pools"]["long"]["healthy"] == 0 and not status["ready"]
        assert metric_sum(metric_samples(gw.admin_url), "slogate_upstream_healthy", upstream="long") == 0


# ------------------------------------------------- health, ejection, retries
@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_killed_replica_is_ejected_nothing_unstarted_is_lost_and_it_returns():
    with start_sim(timing="constant", ttft_ms=5, itl_ms=5) as a, \
            start_sim(timing="constant", ttft_ms=5, itl_ms=5) as b, \
            start_sim(timing="constant", ttft_ms=5, itl_ms=5) as c, \
            start_gateway([f"{a.url}#name=a", f"{b.url}#name=b", f"{c.url}#name=c"], "--policy", "round-robin",
                          "--health-interval", "0.2") as gw:
        async with aiohttp.ClientSession() as s:
            async def burst(n: int) -> list[int]:
                res = await asyncio.gather(*(hold(s, gw.url, body(5)) for _ in range(n)))
                return [st for st, data in res if st == 200 and data.endswith(b"data: [DONE]\n\n")]

            assert len(await burst(12)) == 12
            b.stop(signal.SIGKILL)
            ok = []
            for _ in range(5):  # requests sent after the kill: connect refused -> retried elsewhere
                ok += await burst(12)
            assert len(ok) == 60
            samples = metric_samples(gw.admin_url)
            assert metric_sum(samples, "slogate_ejections_total", upstream="b") >= 1
            assert metric_sum(samples, "slogate_retries_total") >= 1
            assert wait_for(lambda: not get_json(gw.admin_url + "/slogate/status")["routing"]["upstreams"][1]["healthy"])
            with start_sim(timing="constant", ttft_ms=5, itl_ms=5, port=b.port):
                assert wait_for(lambda: get_json(gw.admin_url + "/slogate/status")["routing"]["upstreams"][1]["healthy"])
                before = decisions(gw.admin_url).get("b", 0)
                assert len(await burst(12)) == 12
                assert decisions(gw.admin_url)["b"] >= before + 3  # back in the rotation


async def test_503_before_first_byte_is_retried_on_another_upstream_then_ejected():
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1, fault="dead=0:3600") as dead, \
            start_sim(timing="constant", ttft_ms=1, itl_ms=1) as live, \
            start_gateway([f"{dead.url}#name=dead", f"{live.url}#name=live"], "--policy", "round-robin",
                          "--health-interval", "0") as gw:
        async with aiohttp.ClientSession() as s:
            results = [await hold(s, gw.url, body(3)) for _ in range(10)]
        assert all(st == 200 for st, _ in results)
        samples = metric_samples(gw.admin_url)
        assert metric_sum(samples, "slogate_retries_total", reason="http_503") >= 3
        assert metric_sum(samples, "slogate_ejections_total", upstream="dead", reason="http_503") == 1
        assert metric_sum(samples, "slogate_upstream_healthy", upstream="dead") == 0


# ------------------------------------------------------------------ admission
async def test_admission_queue_then_429_with_retry_after():
    with sims(2, **SLOW) as sim, \
            start_gateway(named(sim.urls), "--max-inflight-requests", "1", "--queue-size", "2",
                          "--queue-timeout", "0.5", "--slo", "ttft=5") as gw:
        async with aiohttp.ClientSession() as s:
            running = [await start_held(s, gw.url, body(60)) for _ in range(2)]
            t0 = time.monotonic()
            queued = [asyncio.create_task(hold(s, gw.url, body(5))) for _ in range(2)]
            await asyncio.sleep(0.1)
            depth = metric_sum(metric_samples(gw.admin_url), "slogate_queue_depth")
            st, headers, data = await asyncio.to_thread(http_request, gw.url, "POST", "/v1/chat/completions",
                                                        body(5), {"Content-Type": "application/json"})
            timed_out = await asyncio.gather(*queued)
            waited = time.monotonic() - t0
            await cancel_all(running)
        assert depth == 2
        assert st == 429 and headers["Retry-After"] == "1"
        err = orjson.loads(data)["error"]
        assert err["code"] == "queue_full" and err["type"] == "rate_limit_exceeded" and "message" in err
        assert [t[0] for t in timed_out] == [429, 429] and 0.45 < waited < 3
        assert orjson.loads(timed_out[0][1])["error"]["code"] == "queue_timeout"
        samples = metric_samples(gw.admin_url)
        assert metric_sum(samples, "slogate_rejections_total", reason="queue_full") == 1
        assert metric_sum(samples, "slogate_rejections_total", reason="queue_timeout") == 2
        assert metric_sum(samples, "slogate_queue_seconds_count") >= 2  # rejections carry their queue time
        window = get_json(gw.admin_url + "/slogate/status")["windows"]["1m"]
        assert window["slos"]["default"]["attainment"] is not None and window["slos"]["default"]["attainment"] < 1


async def test_admission_priority_header_goes_first():
    with start_sim(timing="constant", ttft_ms=5, itl_ms=20) as sim, \
            start_gateway([sim.url], "--max-inflight-requests", "1", "--queue-timeout", "20") as gw:
        done: list[str] = []
        async with aiohttp.ClientSession() as s:
            async def one(name: str, prio: int) -> None:
                tokens = 25 if name == "first" else 2  # the first holds the only slot for ~0.5 s
                st, _ = await hold(s, gw.url, body(tokens), headers={"x-slogate-priority": str(prio)})
                assert st == 200
                done.append(name)

            first = asyncio.create_task(one("first", 0))
            await asyncio.sleep(0.05)
            rest = []
            for name, prio in (("low1", 0), ("low2", 0), ("high", 5)):
                rest.append(asyncio.create_task(one(name, prio)))
                await asyncio.sleep(0.03)
            await asyncio.gather(first, *rest)
        assert done == ["first", "high", "low1", "low2"]


async def test_client_leaving_the_admission_queue_is_recorded_as_499(tmp_path):
    traces = tmp_path / "traces"
    with start_sim(timing="constant", ttft_ms=5, itl_ms=50) as sim, \
            start_gateway([sim.url], "--max-inflight-requests", "1", "--queue-timeout", "20",
                          "--trace-dir", str(traces)) as gw:
        async with aiohttp.ClientSession() as s:
            running = await start_held(s, gw.url, body(60))
            impatient = aiohttp.ClientTimeout(total=0.4)
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(gw.url + "/v1/chat/completions", data=body(5), timeout=impatient,
                                  headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
            assert await until(lambda: metric_sum(metric_samples(gw.admin_url), "slogate_queue_depth") == 0)
            await cancel_all([running])
        records = trace_records(traces, 2)
    gone = [r for r in records if r.status == 499 and r.queue is not None and r.queue > 0]
    assert len(gone) == 1, [(r.status, r.error, r.queue) for r in records]
    assert gone[0].error == "client_disconnect" and 0.3 < gone[0].queue < 2
    assert gone[0].model == SIM_MODEL and gone[0].ttft is None
