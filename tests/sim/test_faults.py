"""Every fault the simulator injects, over real HTTP (aiohttp and the openai SDK)."""

from __future__ import annotations

import asyncio
import itertools
import time

import aiohttp
import openai
import pytest

from slogate.replay.sim.faults import FaultConfig, parse_fault_config, parse_request_fault
from tests.sim.conftest import parse_sse

MODEL = "llama-3-8b"
FAULT = "x-slogate-fault"


def body(stream: bool = True, n: int = 10) -> dict:
    return {"model": MODEL, "prompt": "abcd efgh", "max_tokens": n, "ignore_eos": True, "stream": stream}


def test_parse_header_and_config():
    f = parse_request_fault("stall_ms=2000,stall_after=3")
    assert f.stall_ms == 2000 and f.stall_after == 3
    assert parse_request_fault("hang").hang
    with pytest.raises(ValueError, match="unknown fault"):
        parse_request_fault("explode=1")
    cfg = parse_fault_config(["error_rate=0.5,error_status=503", "dead=10:20", "slowdown=1:2:3", "slow_start=4"])
    assert cfg.error_rate == 0.5 and cfg.dead == [(10.0, 20.0)] and cfg.slowdown == [(1.0, 2.0, 3.0)]
    assert cfg.slow_start_s == 4 and cfg.dead_at(15) == 20 and cfg.slowdown_at(1.5) == 3
    import random

    draws = [FaultConfig(error_rate=0.3).sample(random.Random(7)) for _ in range(3)]
    assert draws == [FaultConfig(error_rate=0.3).sample(random.Random(7)) for _ in range(3)]  # seeded


async def test_error_before_admission(sim_constant, http):
    async with http.post(sim_constant.url + "/v1/completions", json=body(), headers={FAULT: "error=503"}) as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        err = (await r.json())["error"]
    assert err["code"] == 503 and set(err) == {"message", "type", "param", "code"}


async def test_error_after_k_tokens(sim_constant, http):
    async with http.post(sim_constant.url + "/v1/completions", json=body(),
                         headers={FAULT: "error_after=3"}) as r:
        assert r.status == 200
        events = parse_sse(await r.read())
    assert len([e for e in events if isinstance(e, dict) and "choices" in e]) == 3
    assert events[-2]["error"]["code"] == 500 and events[-1] == "[DONE]"


async def test_reset_after_k_tokens(sim_constant, http):
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(sim_constant.url + "/v1/completions", json=body(),
                             headers={FAULT: "reset_after=4"}) as r:
            async for chunk in r.content.iter_any():
                got += chunk
    assert got.count(b'"text"') == 4 and b"[DONE]" not in got


async def test_stall(sim_constant, http):
    t0 = time.perf_counter()
    stamps = []
    async with http.post(sim_constant.url + "/v1/completions", json=body(n=6),
                         headers={FAULT: "stall_ms=400,stall_after=2"}) as r:
        async for chunk in r.content.iter_any():
            stamps += [time.perf_counter() - t0] * chunk.count(b'"text"')
    assert len(stamps) == 6
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert max(gaps) > 0.3 and stamps[-1] > 0.4  # the third token waited ~400 ms


async def test_hang_until_client_gives_up(sim_constant, http):
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(sim_constant.url + "/v1/completions", json=body(), headers={FAULT: "hang"},
                             timeout=aiohttp.ClientTimeout(total=0.5)) as r:
            await r.read()


async def test_delay(sim_constant, http):
    t0 = time.perf_counter()
    async with http.post(sim_constant.url + "/v1/completions", json=body(stream=False, n=1),
                         headers={FAULT: "delay_ms=300"}) as r:
        assert r.status == 200
    assert time.perf_counter() - t0 > 0.3


async def test_bad_fault_header(sim_constant, http):
    async with http.post(sim_constant.url + "/v1/completions", json=body(), headers={FAULT: "boom"}) as r:
        assert r.status == 400


def test_sdk_sees_faults(sim_constant):
    client = openai.OpenAI(base_url=sim_constant.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=3, extra_headers={FAULT: "error=500"})
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=3, extra_headers={FAULT: "error=429"})
    stream = client.completions.create(model=MODEL, prompt="x", max_tokens=9, stream=True,
                                       extra_body={"ignore_eos": True}, extra_headers={FAULT: "error_after=2"})
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    with pytest.raises(openai.APIError):
        for _ in client.completions.create(model=MODEL, prompt="x", max_tokens=9, stream=True,
                                           extra_body={"ignore_eos": True}, extra_headers={FAULT: "reset_after=2"}):
            pass
    t0 = time.perf_counter()
    stamps = []
    for chunk in client.completions.create(model=MODEL, prompt="x", max_tokens=4, stream=True,
                                           extra_body={"ignore_eos": True},
                                           extra_headers={FAULT: "delay_ms=150,stall_ms=300,stall_after=1"}):
        stamps.append(time.perf_counter() - t0)
        assert chunk.choices[0].text
    assert len(stamps) == 4 and stamps[0] > 0.15 and stamps[1] - stamps[0] > 0.25
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).completions.create(model=MODEL, prompt="x", max_tokens=3,
                                                            extra_headers={FAULT: "hang"})


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_engine_wide_slow_start_dead_window(sim_server, http):
    sim = sim_server(timing="constant", ttft_ms=20, itl_ms=20,
                     extra_args=["--fault", "slow_start=1", "--fault", "dead=2:3"])
    async with http.get(sim.url + "/health") as r:
        assert r.status == 503
    async with http.post(sim.url + "/v1/completions", json=body(stream=False)) as r:
        assert r.status == 503
    t0 = time.perf_counter()
    while (await http.get(sim.url + "/health")).status != 200:
        assert time.perf_counter() - t0 < 5
        await asyncio.sleep(0.05)
    # a long stream crosses the dead window (starts ≤ 2 s after start): error event, then [DONE]
    async with http.post(sim.url + "/v1/completions", json=body(n=200)) as r:
        events = parse_sse(await r.read())
    assert any(isinstance(e, dict) and "error" in e for e in events) and events[-1] == "[DONE]"
    async with http.post(sim.url + "/v1/completions", json=body(stream=False)) as r:
        assert r.status == 503  # still inside the window
    await asyncio.sleep(1.2)
    async with http.post(sim.url + "/v1/completions", json=body(stream=False, n=2)) as r:
        assert r.status == 200


async def test_slowdown_window_and_rates(sim_server, http):
    sim = sim_server(seed=3, extra_args=["--fault", "slowdown=0:600:4", "--fault", "error_rate=0.5"])
    statuses = []
    for _ in range(20):
        async with http.post(sim.url + "/v1/completions", json=body(stream=False, n=2)) as r:
            statuses.append(r.status)
    assert 3 <= statuses.count(500) <= 17 and statuses.count(200) >= 3
    async with http.get(sim.url + "/metrics") as r:
        text = await r.text()
    ttft_sum = float(next(ln for ln in text.splitlines()
                          if ln.startswith("vllm:time_to_first_token_seconds_sum")).split()[-1])
    n = statuses.count(200)
    assert ttft_sum / n > 3 * 0.0077  # a tiny prefill step on H100 takes ~7.7 ms; 4× slower here


async def test_bounded_queue_rejects(sim_server, http):
    sim = sim_server(max_num_seqs=1, extra_args=["--max-waiting", "1", "--reject-status", "429"])
    long = {"model": MODEL, "prompt": "x", "max_tokens": 60, "ignore_eos": True}
    first = asyncio.create_task(http.post(sim.url + "/v1/completions", json=long))
    await asyncio.sleep(0.1)  # running now; one more may wait, the rest are turned away
    rest = [asyncio.create_task(http.post(sim.url + "/v1/completions", json=long)) for _ in range(3)]
    resps = await asyncio.gather(first, *rest)
    statuses = [r.status for r in resps]
    assert sorted(statuses) == [200, 200, 429, 429]
    rejected = next(r for r in resps if r.status == 429)
    assert rejected.headers["Retry-After"] == "1" and (await rejected.json())["error"]["code"] == 429
    for r in resps:
        r.release()
