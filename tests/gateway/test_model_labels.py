"""Model labels bounded by what the upstreams serve (gateway/model_list.py, LiveMetrics.model_label):
names the upstreams' `/v1/models` list, or without a list the first names an upstream served; names
it rejected never take a label slot. Against a real `slogate sim` and a real gateway."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from slogate.gateway.live_metrics import LiveMetrics
from slogate.gateway.model_list import MAX_LISTED, parse_model_list, watch_models
from slogate.traces.record import RequestRecord
from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, metric_samples, wait_for
from tests.realservers import start_gateway
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


def _label(m: LiveMetrics, model: str, status: int = 200) -> str:
    return m.labels(RequestRecord(t=0.0, model=model, status=status))[2]


def test_rejected_names_take_no_label_slot() -> None:
    m = LiveMetrics([], max_models=4)
    assert all(_label(m, f"bogus-{i}", 404) == "other" for i in range(100))
    assert [_label(m, n) for n in ("a", "b", "c", "d", "e")] == ["a", "b", "c", "d", "other"]
    assert _label(m, "a", 404) == "a"  # a served name keeps its label when a later request fails
    assert _label(LiveMetrics([]), "x", 500) == "x"  # an upstream failure does not say the name is bad
    assert _label(LiveMetrics([]), "y", 429) == "y"  # nor does admission


def test_listed_names_are_the_only_labels_and_stay_capped() -> None:
    m = LiveMetrics([], max_models=3)
    m.list_models(frozenset({"x", "y", "z", "w"}))
    assert _label(m, "served-but-unlisted") == "other"
    assert [_label(m, n, 404) for n in ("x", "y", "z", "w")] == ["x", "y", "z", "other"]
    declared = LiveMetrics([], known_models=["k"])  # the config's models= wins over any list
    declared.list_models(frozenset({"x"}))
    assert (_label(declared, "x"), _label(declared, "k")) == ("other", "k")


def test_parse_model_list() -> None:
    assert parse_model_list(b"not json") is None and parse_model_list(b"[1]") is None
    assert parse_model_list(b'{"data": 5}') is None
    body = orjson.dumps({"data": [{"id": "a"}, {"id": 5}, "b", {"id": ""}, {"id": "x" * 300}, {"id": "c"}]})
    assert parse_model_list(body) == ["a", "c"]
    many = orjson.dumps({"data": [{"id": f"m{i}"} for i in range(1000)]})
    assert len(parse_model_list(many) or []) == MAX_LISTED


async def test_watch_models_reads_a_real_upstream_and_ignores_a_dead_one() -> None:
    seen: list[frozenset[str]] = []
    with start_sim(served_model_name="served-name") as sim:
        dead = f"http://127.0.0.1:{free_port()}"
        task = asyncio.create_task(watch_models([dead, sim.url], seen.append, interval=0.1, timeout=2))
        try:
            for _ in range(200):
                if len(seen) >= 2:
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
    assert seen[:2] == [frozenset({"served-name"})] * 2


def test_a_gateway_labels_only_models_its_upstream_serves() -> None:
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        admin = free_port()
        with start_gateway(sim.url, extra_args=("--admin-listen", f"127.0.0.1:{admin}")) as gw:
            def chat(model: str) -> int:
                body = orjson.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
                return http_request(gw.url, "POST", "/v1/chat/completions", body,
                                    {"Content-Type": "application/json"})[0]

            assert {chat(f"client-made-{i}") for i in range(40)} == {404}
            assert chat(SIM_MODEL) == 200

            def models() -> set[str]:
                return {lab["gen_ai_request_model"] for lab, _ in
                        metric_samples(f"http://127.0.0.1:{admin}").get("slogate_requests_total", [])}

            assert wait_for(lambda: models() == {SIM_MODEL, "other"}, timeout=5), models()
