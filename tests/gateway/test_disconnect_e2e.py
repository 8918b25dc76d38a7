"""A client that leaves in the middle of a stream: the request's E2E runs until the gateway saw it go
(as Envoy's and nginx's request duration runs to the downstream disconnect), not to the last chunk it
relayed. With the upstream stalled after two tokens, the E2E used to read ~the TTFT."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.gateway.fixtures_gateway import start_gateway, trace_records
from tests.simserver import start_sim


async def test_a_client_that_leaves_mid_stream_is_timed_to_its_departure(tmp_path):
    trace_dir = tmp_path / "trace"
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20,
            "ignore_eos": True, "stream": True}
    with start_sim(timing="constant", ttft_ms=20, itl_ms=10) as sim, \
            start_gateway(sim.url, "--trace-dir", str(trace_dir)) as gw:
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            # the upstream stalls 3 s after its second token: nothing is relayed while the client waits
            async with s.post(gw.url + "/v1/chat/completions", json=body,
                              headers={"x-slogate-fault": "stall_after=2,stall_ms=3000"}) as r:
                assert r.status == 200
                events = 0
                async for line in r.content:
                    events += line.startswith(b"data: ")
                    if events == 3:  # role chunk + two tokens
                        break
                await asyncio.sleep(0.8)
                left = time.monotonic() - t0
                r.close()  # the client leaves
        (record,) = trace_records(trace_dir, 1, timeout=15)
    assert record.error == "client_disconnect"
    assert record.e2e is not None and left - 0.05 <= record.e2e <= left + 0.5, (record.e2e, left)
