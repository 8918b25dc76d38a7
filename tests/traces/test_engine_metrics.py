"""One list of engine metric names: the sim exposes them, the gateway's and the replay's scrapers
read them, and several engines' KV-cache usage combines one way (the mean)."""

from __future__ import annotations

import math

import pytest

from slogate.gateway.routing.scrape import parse_engine_load
from slogate.replay.scrape import parse_metrics
from slogate.replay.sim.prom import ServerStats, SimCollector, make_registry, render
from slogate.traces.engine_metrics import ENGINE_METRICS, FRACTIONS, IDEA_OF, combine_usage, counter_family


def test_combine_usage_is_the_clamped_mean_of_finite_values() -> None:
    assert combine_usage([0.2, 0.6]) == pytest.approx(0.4)
    assert combine_usage([1.5, -1.0]) == 0.5  # clamped to 0..1 first
    assert combine_usage([0.3, math.nan, math.inf]) == 0.3
    assert combine_usage([]) is None and combine_usage([math.nan]) is None


def test_every_series_names_one_idea() -> None:
    assert len(IDEA_OF) == sum(len(names) for names in ENGINE_METRICS.values())
    assert set(ENGINE_METRICS) >= FRACTIONS
    assert counter_family("vllm:num_preemptions_total") == "vllm:num_preemptions"


def _sim_page(*engines: tuple[int, int, float, int, int, int]) -> bytes:
    collectors = [SimCollector("m", i, ServerStats(), lambda g=g: g) for i, g in enumerate(engines)]
    return render(make_registry(*collectors))


def test_the_sims_page_is_read_by_both_scrapers() -> None:
    page = _sim_page((3, 7, 0.2, 11, 100, 40), (1, 1, 0.6, 1, 50, 10))
    got = parse_metrics(page.decode())
    assert got.pop("resident_memory_bytes") > 0  # prometheus_client's process collector: the sim process's memory
    assert got == {"running": 4, "waiting": 8, "kv_cache_usage": pytest.approx(0.4), "preemptions_total": 12,
                   "prefix_cache_queries_total": 150, "prefix_cache_hits_total": 50}
    assert parse_engine_load(page) == (8.0, pytest.approx(0.4))  # the gateway: waiting summed, usage the mean


def test_other_engines_names() -> None:
    sglang = "sglang:num_queue_reqs{e=\"0\"} 2\nsglang:token_usage{e=\"0\"} 0.2\nsglang:token_usage{e=\"1\"} 0.4\n"
    assert parse_metrics(sglang) == {"waiting": 2, "kv_cache_usage": pytest.approx(0.3)}
    assert parse_engine_load(sglang.encode()) == (2.0, pytest.approx(0.3))
    assert parse_metrics("llamacpp:requests_processing 3\nllamacpp:kv_cache_usage_ratio 0.5\n") == {
        "running": 3, "kv_cache_usage": 0.5}
