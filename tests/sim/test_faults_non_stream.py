"""Mid-generation faults (`error_after`, `reset_after`, `stall_*`) on non-streaming requests, over real HTTP.

They used to apply to streams only: a non-streaming request with `error_after=2` (or drawn by
`--fault error_after_rate=…`) got a 200, so a gateway's handling of engine failures on plain requests
could not be tested. vLLM fails such a request with a 500 error body.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from tests.servers import Server
from tests.simserver import start_sim

MODEL = "llama-3-8b"
FAULT = "x-slogate-fault"
BODY = {"model": MODEL, "prompt": "abcd efgh", "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def sim() -> Iterator[Server]:
    with start_sim(timing="constant", ttft_ms=5, itl_ms=2) as s:
        yield s


async def gauges(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running", 'vllm:request_success_total{engine="0",finished_reason'))
            and ('finished_reason="' not in line or 'finished_reason="error"' in line)}


async def test_error_after_k_tokens_is_a_500_body(sim, http):
    before = await gauges(http, sim.url)
    async with http.post(sim.url + "/v1/completions", json=BODY, headers={FAULT: "error_after=2"}) as r:
        assert (r.status, r.content_type) == (500, "application/json")
        err = (await r.json())["error"]
    assert err == {"message": "Simulated engine error after 2 tokens.", "type": "InternalServerError",
                   "param": None, "code": 500}
    after = await gauges(http, sim.url)
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 1  # finished_reason=error
    assert after["vllm:num_requests_running"] == 0


async def test_reset_after_k_tokens_resets_the_connection(sim, http):
    with pytest.raises(aiohttp.ClientError):
        async with http.post(sim.url + "/v1/chat/completions", headers={FAULT: "reset_after=3"},
                             json={**BODY, "prompt": None, "messages": [{"role": "user", "content": "x"}]}) as r:
            await r.read()
    for _ in range(200):  # the engine dropped the request
        if (await gauges(http, sim.url))["vllm:num_requests_running"] == 0:
            break
        await asyncio.sleep(0.01)
    assert (await gauges(http, sim.url))["vllm:num_requests_running"] == 0
    async with http.post(sim.url + "/v1/completions", json=BODY) as r:  # the server is fine
        assert r.status == 200


async def test_stall_delays_the_body(sim, http):
    t0 = time.perf_counter()
    async with http.post(sim.url + "/v1/completions", json=BODY, headers={FAULT: "stall_ms=400,stall_after=2"}) as r:
        assert r.status == 200
        assert (await r.json())["usage"]["completion_tokens"] == 6
    assert time.perf_counter() - t0 > 0.4


def test_configured_rates_reach_non_streaming_requests(sim_server):
    """`--fault error_after_rate=1` fails every request, streaming or not; the SDK sees a 500."""
    server = sim_server(timing="constant", ttft_ms=5, itl_ms=1, fault="error_after_rate=1,error_after=1")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="after 1 tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"ignore_eos": True})
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4)
