"""A client's max_tokens feeds the router's in-flight token estimate. With `--workers 2` that estimate
lives in shared int64 slots: 2**63 − 1 overflowed them and the gateway dropped the connection with no
response and no record. A negative one would lower an upstream's load. Both are bounded now, and every
request is relayed (the upstream answers) and recorded."""

from __future__ import annotations

import asyncio

from tests.gateway.fixtures_gateway import trace_records
from tests.gateway.test_workers import FAST, admin_url, both_up, new_connections, workers
from tests.servers import free_port
from tests.simserver import start_sim


async def test_any_max_tokens_is_relayed_and_recorded_with_workers(tmp_path):
    trace_dir = tmp_path / "trace"
    admin_port = free_port()
    values = [2**63 - 1, 2**63 - 2, -(10**18), 2**70, 5]
    with start_sim(**FAST) as sim, workers(sim.url, "--trace-dir", str(trace_dir), admin=admin_port) as gw:
        both_up(admin_url(admin_port))
        async with new_connections() as s:
            async def one(max_tokens: int) -> int:
                body = b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": %d}' % (
                    max_tokens)
                async with s.post(gw.url + "/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(one(v) for v in values * 2))  # fresh connections: both workers
        records = trace_records(trace_dir, len(values) * 2)
    assert statuses == [400, 400, 400, 400, 200] * 2  # the upstream's answers, relayed
    assert sorted(r.status for r in records) == sorted(statuses)
