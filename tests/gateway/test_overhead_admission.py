"""The gateway's overhead of a request (`overhead` in the trace, slogate_gateway_overhead_seconds) is its
own time on it: a wait in the admission queue is the request's `queue`, never overhead."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from slogate.traces import formats
from tests.gateway.fixtures_gateway import http_request, start_gateway
from tests.simserver import start_sim


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_a_wait_for_admission_is_queue_not_overhead(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    body = json.dumps({"model": "llama-3-8b", "prompt": "hello", "max_tokens": 40, "min_tokens": 40,
                       "stream": True}).encode()
    statuses: list[int] = []
    with (start_sim(timing="constant", ttft_ms=5, itl_ms=20) as sim,  # ~0.8 s a stream
          start_gateway(sim.url, "--max-inflight-requests", "1", "--queue-timeout", "10", "--trace-dir", str(trace)) as gw):

        def one() -> None:
            statuses.append(http_request(gw.url, "POST", "/v1/completions", body,
                                         {"Content-Type": "application/json"})[0])

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert statuses == [200, 200]
    _, records = formats.load(trace)
    waited = max(records, key=lambda r: r.queue or 0.0)
    assert len(records) == 2 and waited.queue is not None and waited.queue > 0.5, records
    assert waited.overhead is not None and waited.overhead < 0.1, (waited.queue, waited.overhead)
