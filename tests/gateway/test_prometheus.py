"""A real Prometheus scrapes the gateway; PromQL over its metrics matches the traffic the test sent.

The gateway fronts a constant-timing sim (TTFT 50 ms, 10 ms per token); an e2e SLO is met by short
streams and missed by long ones, so goodput and TTFT quantiles have known values.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import aiohttp
import pytest

from tests.realservers import promql, promql_value, start_gateway, wait_scraped
from tests.simserver import start_sim

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(180)]

SIM_TTFT_MS, SIM_ITL_MS = 50, 10
SLO = "interactive:ttft=0.5,e2e=0.8"
N_REQUESTS, SPAN_S = 60, 20.0
SHORT, LONG = 8, 128  # max_tokens: e2e ≈ 50 + 7·10 = 120 ms (good) vs 50 + 127·10 = 1320 ms (misses e2e)
_OUTPUT = re.compile(rb'"text"\s*:\s*"[^"]')


def _max_tokens(i: int) -> int:
    return LONG if i % 3 == 0 else SHORT  # 40 short (good) and 20 long (not good)


async def _send(session: aiohttp.ClientSession, url: str, model: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": "hello " * 16,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    first, chunks = None, 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for piece in resp.content.iter_any():
            found = len(_OUTPUT.findall(piece))
            if found and first is None:
                first = time.perf_counter()
            chunks += found
    assert first is not None
    return {"max_tokens": max_tokens, "ttft": first - t0, "e2e": time.perf_counter() - t0, "chunks": chunks}


async def _traffic(url: str, model: str) -> list[dict]:
    """N_REQUESTS streams evenly spread over SPAN_S seconds (open loop)."""
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        tasks = []
        for i in range(N_REQUESTS):
            await asyncio.sleep(max(0.0, start + i * SPAN_S / N_REQUESTS - time.perf_counter()))
            tasks.append(asyncio.create_task(_send(session, url, model, _max_tokens(i))))
        return await asyncio.gather(*tasks)


def _ttft_bucket_bounds(metrics_url: str) -> list[float]:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    bounds = re.findall(r'^gen_ai_server_time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"', text, re.M)
    return sorted({float(b) for b in bounds if b != "+Inf"})


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_promql_ttft_quantile_and_goodput_rate(prometheus) -> None:
    with (
        start_sim(timing="constant", ttft_ms=SIM_TTFT_MS, itl_ms=SIM_ITL_MS) as sim,
        start_gateway(sim.url, slos=[SLO], extra_args=["--admin-listen", f"127.0.0.1:{prometheus.target_port}"]) as gw,
    ):
        model = json.load(urllib.request.urlopen(sim.url + "/v1/models", timeout=5))["data"][0]["id"]
        wait_scraped(prometheus.url, prometheus.job, scrapes=2)
        sent = await _traffic(gw.url, model)
        good = [s for s in sent if s["max_tokens"] == SHORT]
        # The split between good and not good must be unambiguous on this machine, or the test means nothing.
        assert all(s["e2e"] < 0.6 for s in good), [round(s["e2e"], 3) for s in good]
        assert all(s["e2e"] > 1.0 for s in sent if s["max_tokens"] == LONG)
        assert all(s["chunks"] == s["max_tokens"] for s in sent)

        # Wait for a scrape that saw every request recorded (the gateway records just after the last
        # byte went out), then evaluate everything at that instant.
        good_expr, all_expr = "sum(slogate_good_requests_total)", "sum(slogate_requests_total)"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            at = time.time()
            if (promql_value(prometheus.url, all_expr, at=at) or 0) >= N_REQUESTS:
                break
            time.sleep(0.25)
        assert promql_value(prometheus.url, all_expr, at=at) == N_REQUESTS
        assert promql_value(prometheus.url, good_expr, at=at) == len(good)

        ttft_p99 = promql_value(
            prometheus.url,
            "histogram_quantile(0.99, rate(gen_ai_server_time_to_first_token_seconds_bucket[1m]))",
            at=at,
        )
        good_rate = promql(prometheus.url, "rate(slogate_good_requests_total[1m])", at=at)
        bounds = _ttft_bucket_bounds(gw.admin_url + "/metrics")

    print(
        f"PromQL TTFT p99 {ttft_p99:.4f} s; good rate {good_rate[0]['value'][1]}/s for {len(good)} good in 1m"
    )
    # TTFT p99 falls in the buckets spanning what was sent: from the sim's 50 ms (no TTFT can be shorter)
    # to the client's slowest TTFT (the gateway's TTFT of a request is never longer than the client's).
    # With 60 requests the 0.99 rank lands on the slowest one, so the bound is the max, not a p99.
    client_ttfts = sorted(s["ttft"] for s in sent)
    lo = max(b for b in bounds if b < SIM_TTFT_MS / 1000)
    hi = min(b for b in bounds if b >= client_ttfts[-1])
    assert ttft_p99 is not None and lo <= ttft_p99 <= hi, (ttft_p99, lo, hi, client_ttfts[-5:])

    # Goodput: rate over the 1-minute window ≈ good requests sent / 60 s (all traffic lies inside it).
    assert [s["metric"].get("slo") for s in good_rate] == ["interactive"], good_rate
    rate = float(good_rate[0]["value"][1])
    assert rate * 60 == pytest.approx(len(good), rel=0.15), (rate, len(good))
