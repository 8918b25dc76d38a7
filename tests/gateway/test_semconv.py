"""OTel GenAI semconv labels on every `gen_ai_*` series, bounded model cardinality, process and build info.

A real gateway in front of the sim serves chat, completions and embeddings; a unit check sends 5,000
distinct model names through LiveMetrics and counts the series that come out.
"""

from __future__ import annotations

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slogate import __version__
from slogate.gateway.live_metrics import GENAI_LABELS, LiveMetrics, MetricsCollector, make_registry, render
from slogate.traces.record import RequestRecord
from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, metric_samples, start_gateway
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)


def _families(metrics: LiveMetrics) -> dict:
    registry = make_registry(MetricsCollector(metrics, lambda: [], lambda: None))
    return {f.name: f for f in text_string_to_metric_families(render(registry).decode())}


def test_semconv_labels_on_every_genai_series_from_a_real_gateway() -> None:
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, start_gateway(sim.url, "--provider-name", "vllm") as gw:
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
            ("/v1/completions", {"prompt": "hi"}),
            ("/v1/embeddings", {"input": "hi"}),
        ):
            status, _, _ = http_request(gw.url, "POST", path, orjson.dumps({"model": SIM_MODEL, "max_tokens": 3, **body}),
                                        {"Content-Type": "application/json"})
            assert status == 200, path
        samples = metric_samples(gw.admin_url)
    genai = [(name, labels) for name, ss in samples.items() if name.startswith("gen_ai_") for labels, _ in ss]
    assert len({name for name, _ in genai}) >= 4 * 3  # four families × _bucket/_sum/_count
    for name, labels in genai:
        assert set(GENAI_LABELS) <= set(labels), (name, labels)
        assert "model" not in labels  # the legacy label is opt-in
        assert labels["gen_ai_provider_name"] == "vllm"
        assert labels["gen_ai_request_model"] == labels["gen_ai_response_model"] == SIM_MODEL
    ops = {labels["gen_ai_operation_name"] for labels, _ in samples["gen_ai_server_request_duration_seconds_count"]}
    assert ops == {"chat", "text_completion", "embeddings"}
    assert all("error_type" in labels for labels, _ in samples["gen_ai_server_request_duration_seconds_count"])
    assert samples["process_resident_memory_bytes"][0][1] > 0
    assert [labels["version"] for labels, _ in samples["slogate_build_info"]] == [__version__]


def test_legacy_model_label_is_opt_in() -> None:
    m = LiveMetrics([], legacy_model_label=True)
    m.observe(RequestRecord(t=0.0, model="m", ttft=0.1, e2e=0.2, output_tokens=3), (), None)
    fams = _families(m)
    for name in ("gen_ai_server_time_to_first_token_seconds", "slogate_requests", "slogate_output_tokens"):
        s = fams[name].samples[0]
        assert s.labels["model"] == s.labels["gen_ai_request_model"] == "m", name


@pytest.mark.parametrize("known", [None, ["llama", "qwen"]])
def test_5000_model_names_give_bounded_series(known) -> None:
    m = LiveMetrics([], max_models=32, known_models=known)
    for i in range(5000):
        name = ["llama", "qwen"][(i // 10) % 2] if i % 10 == 0 else f"client-model-{i}"
        m.observe(RequestRecord(t=0.0, model=name, ttft=0.1, tpot=0.01, e2e=0.2, input_tokens=5,
                                output_tokens=3, finish_reason="stop", upstream="u"), (), [0.01])
    fams = _families(m)
    models = {s.labels["gen_ai_request_model"] for f in fams.values() for s in f.samples
              if "gen_ai_request_model" in s.labels}
    if known is None:
        assert len(models) == 33  # the first 32 names seen + "other"
    else:
        assert models == {"llama", "qwen", "other"}
    n_models = len(models)
    for name, fam in fams.items():  # label sets per family, `le` aside: at most one per model (× token type)
        sets = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in fam.samples}
        assert len(sets) <= 2 * n_models, (name, len(sets))
    assert sum(s.value for s in fams["slogate_requests"].samples) == 5000


def test_response_model_is_the_upstreams_model() -> None:
    """A request without "model": gen_ai_request_model is `none`, gen_ai_response_model the name the
    sim answered with (read from its first SSE chunk / JSON body by the observer)."""
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, start_gateway(sim.url) as gw:
        for stream in (True, False):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream}
            status, _, _ = http_request(gw.url, "POST", "/v1/chat/completions", orjson.dumps(body),
                                        {"Content-Type": "application/json"})
            assert status == 200
        samples = metric_samples(gw.admin_url)
    pairs = [(labels["gen_ai_request_model"], labels["gen_ai_response_model"], n)
             for labels, n in samples["gen_ai_server_request_duration_seconds_count"]]
    assert pairs == [("none", SIM_MODEL, 2.0)]


def test_response_model_folds_into_the_bounded_set() -> None:
    m = LiveMetrics([], known_models=["alias"])
    m.observe(RequestRecord(t=0.0, model="alias", response_model="unlisted-real-name", e2e=0.2), (), None)
    m.observe(RequestRecord(t=0.0, model="alias", response_model="alias", e2e=0.2), (), None)
    labels = [s.labels for s in _families(m)["gen_ai_server_request_duration_seconds"].samples
              if s.name.endswith("_count")]
    assert sorted((x["gen_ai_request_model"], x["gen_ai_response_model"]) for x in labels) == [
        ("alias", "alias"), ("alias", "other")]
