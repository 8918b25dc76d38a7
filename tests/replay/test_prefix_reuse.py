"""A Mooncake conversation slice replayed over HTTP against the sim reproduces the trace's prefix reuse.

Method. The trace gives each request's chained 512-token block ids; equal ids mean equal prefixes.
The *best-case* reuse the sim can show is what an LRU cache of the sim's KV capacity would hit:
walk the requests in arrival order, count each request's leading ids already cached (stop at the
first miss: a prefix cache only matches prefixes) × 512 tokens (capped at the prompt length), then
insert/refresh all its ids and evict least-recently-used ids beyond the capacity
(kv_blocks × 16 tokens / 512 tokens per id). Divided by all prompt tokens, that is the rate an
ideal engine with that much cache would report. The replay synthesizes prompts whose blocks are
equal text exactly when their ids are equal; the sim tokenizes that text, hashes it in 16-token
blocks and caches it like vLLM, so its own counters (`vllm:prefix_cache_hits_total /
vllm:prefix_cache_queries_total` on /metrics) must land within 5 points of the best case.
Outputs are cut to 8 tokens (reuse depends on prompts only) and the simulated GPU is made very
fast (`--gpu-set`) so the engine keeps up with 10× speed on this machine.
"""

from __future__ import annotations

import collections
import urllib.request

import msgspec
import pytest

from slogate.replay import workload as wl
from slogate.replay.run import ReplayOptions, replay
from slogate.replay.scrape import parse_metrics
from slogate.replay.source import load_trace, trace_workload
from tests.replay.conftest import MOONCAKE
from tests.simserver import start_sim

KV_BLOCKS = 320_000  # 16-token blocks → 10,000 Mooncake blocks of 512 tokens


def best_case_hit_rate(reqs: list[wl.PlannedRequest], capacity_ids: int, block_tokens: int = 512) -> float:
    cache: collections.OrderedDict[int, None] = collections.OrderedDict()
    queried = hit = 0
    for r in reqs:
        ids = r.hash_ids or []
        n = 0
        for h in ids:
            if h not in cache:
                break
            n += 1
        queried += r.input_tokens
        hit += min(n * block_tokens, r.input_tokens)
        for h in ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity_ids:
            cache.popitem(last=False)
    return hit / queried


@pytest.mark.slow
def test_mooncake_prefix_reuse_matches_best_case() -> None:
    trace = trace_workload(load_trace(MOONCAKE))
    reqs = wl.speed(wl.window(trace.requests, 0, 300), 10)
    trace.requests = [msgspec.structs.replace(r, output_tokens=8) for r in reqs]
    expected = best_case_hit_rate(trace.requests, KV_BLOCKS * 16 // 512)
    with start_sim(kv_blocks=KV_BLOCKS, extra_args=["--max-model-len", "131072", "--gpu-set",
                                                    "hbm_tb_s=100,bf16_tflops=100000"]) as sim:
        out = replay(trace, ReplayOptions(target=sim.url, endpoint="completions", seed=1))
        with urllib.request.urlopen(sim.url + "/metrics") as resp:
            m = parse_metrics(resp.read().decode())
    s = out.results.summary
    assert s.failed == 0 and s.input_token_drift == 0
    measured = m["prefix_cache_hits_total"] / m["prefix_cache_queries_total"]
    assert expected > 0.1  # the slice does reuse prefixes at this cache size
    print(f"prefix-cache hit rate: sim {measured:.3f}, best case (LRU of {KV_BLOCKS * 16 // 512} ids) {expected:.3f}")
    assert abs(measured - expected) < 0.05, (measured, expected)
