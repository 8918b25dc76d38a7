"""Inference engines' Prometheus names: one slogate name per idea ← the series vLLM (and slogate
sim, which speaks vLLM), SGLang and llama.cpp expose for it, and the one rule that combines a
fraction (KV-cache usage) reported by several engines. Pure data; never fetches or parses a page.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# Sample names as they appear in the text exposition (counters with their `_total`). The first
# name of each idea is current vLLM's, the one `slogate sim` exposes; older vLLM names follow.
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
# a fraction 0..1 of the engine's KV cache; gpu_cache_usage_perc is vLLM's old name
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                  "llamacpp:kv_cache_usage_ratio")
PREEMPTIONS_TOTAL = ("vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_CACHE_QUERIES_TOTAL = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_CACHE_HITS_TOTAL = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_CACHE_HIT_RATE = ("sglang:cache_hit_rate",)  # a fraction 0..1
RESIDENT_MEMORY_BYTES = ("process_resident_memory_bytes",)  # the server process (prometheus_client's collector)

ENGINE_METRICS: dict[str, tuple[str, ...]] = {
    "running": RUNNING,
    "waiting": WAITING,
    "kv_cache_usage": KV_CACHE_USAGE,
    "preemptions_total": PREEMPTIONS_TOTAL,
    "prefix_cache_queries_total": PREFIX_CACHE_QUERIES_TOTAL,
    "prefix_cache_hits_total": PREFIX_CACHE_HITS_TOTAL,
    "prefix_cache_hit_rate": PREFIX_CACHE_HIT_RATE,
    "resident_memory_bytes": RESIDENT_MEMORY_BYTES,
}
# Ideas whose value is a fraction: several engines (label sets) combine with `combine_usage`;
# every other idea is a count and its label sets are summed.
FRACTIONS = frozenset({"kv_cache_usage", "prefix_cache_hit_rate"})
# engine series name -> slogate name
IDEA_OF: dict[str, str] = {name: idea for idea, names in ENGINE_METRICS.items() for name in names}


def combine_usage(values: Iterable[float]) -> float | None:
    """The usage of several engines (one sample per engine, each clamped to 0..1) as one fraction:
    their mean, i.e. the share of the pooled cache in use when the engines' caches are equal (a
    data-parallel deployment). Not the max (one busy engine would mark the whole upstream full) and
    not the sum (two engines would exceed 1). Non-finite values are skipped; None when none is left."""
    clamped = [min(1.0, max(0.0, v)) for v in values if math.isfinite(v)]
    return sum(clamped) / len(clamped) if clamped else None


def counter_family(sample_name: str) -> str:
    """The family name of a counter sample (`vllm:num_preemptions_total` → `vllm:num_preemptions`),
    as prometheus_client's CounterMetricFamily wants it."""
    return sample_name.removesuffix("_total")
