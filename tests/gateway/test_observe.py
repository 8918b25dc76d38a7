"""What the gateway measures and exports after real traffic: /metrics (on the admin listener),
/slogate/status, the captured trace (counts, tokens, prefix hash ids) — and the privacy canary:
a unique string sent in prompts and in the Authorization header appears in no byte the gateway
writes (trace segments, its log, /metrics, /slogate/status).
"""

from __future__ import annotations

import signal

import openai
import orjson
import pytest
import zstandard

from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import (
    CANARY,
    SIM_MODEL,
    get,
    get_json,
    http_request,
    metric_samples,
    metric_sum,
    start_gateway,
    trace_records,
)
from tests.servers import free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)

SHARED = "You are a helpful assistant. " * 40  # > 1 block: shared prefix of every chat prompt


def _traffic(client: openai.OpenAI) -> list[dict]:
    """Mixed requests; returns what the client itself saw per request."""
    seen = []
    for i in range(6):
        usage = i % 2 == 1
        msgs = [{"role": "system", "content": SHARED}, {"role": "user", "content": f"{CANARY} question {i}"}]
        opts = {"stream_options": {"include_usage": True}} if usage else {}
        chunks = list(client.chat.completions.create(model=SIM_MODEL, messages=msgs, max_tokens=5 + i, stream=True,
                                                     extra_body={"ignore_eos": True}, **opts))
        out = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
        seen.append({"kind": "chat-stream", "output": out, "usage_chunks": sum(c.usage is not None for c in chunks)})
    for i in range(3):
        r = client.completions.create(model=SIM_MODEL, prompt=f"{CANARY} complete {i}", max_tokens=4,
                                      extra_body={"ignore_eos": True})
        seen.append({"kind": "completion", "output": r.usage.completion_tokens, "input": r.usage.prompt_tokens})
    return seen


def test_metrics_status_trace_and_privacy(tmp_path):
    trace_dir = tmp_path / "trace"
    admin_port = free_port()
    with start_sim(timing="constant", ttft_ms=15, itl_ms=2, seed=3) as sim, start_gateway(
        sim.url, "--admin-listen", f"127.0.0.1:{admin_port}", "--trace-dir", str(trace_dir),
        "--slo", "loose:ttft=5,tpot=1", "--slo", "impossible:e2e=1us", "--trace-flush-interval", "0.2",
    ) as gw:
        admin = f"http://127.0.0.1:{admin_port}"
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=f"sk-{CANARY}", max_retries=0, timeout=30)
        seen = _traffic(client)
        # a request the upstream rejects (unknown model) is measured and not good
        status, _, _ = http_request(gw.url, "POST", f"/v1/chat/completions?q={CANARY}", orjson.dumps(
            {"model": "nope", "messages": [{"role": "user", "content": CANARY}]}),
            {"Authorization": f"Bearer {CANARY}", "X-Canary": CANARY})
        assert status == 404
        n = len(seen) + 1
        out_tokens = sum(s["output"] for s in seen)
        assert all(s["usage_chunks"] == (1 if i % 2 else 0) for i, s in enumerate(seen[:6]))

        samples = metric_samples(admin)
        assert metric_sum(samples, "slogate_requests_total") == n
        assert metric_sum(samples, "slogate_requests_total", status_class="4xx") == 1
        assert metric_sum(samples, "slogate_good_requests_total", slo="loose") == n - 1
        assert metric_sum(samples, "slogate_good_requests_total", slo="impossible") == 0
        assert metric_sum(samples, "slogate_good_output_tokens_total", slo="loose") == out_tokens
        assert metric_sum(samples, "slogate_output_tokens_total", gen_ai_request_model=SIM_MODEL) == out_tokens
        assert metric_sum(samples, "slogate_input_tokens_total", gen_ai_request_model=SIM_MODEL) > 0
        assert metric_sum(samples, "gen_ai_server_time_to_first_token_seconds_count") == 6
        assert metric_sum(samples, "gen_ai_server_request_duration_seconds_count") == n
        ttft_sum = metric_sum(samples, "gen_ai_server_time_to_first_token_seconds_sum")
        assert 6 * 0.010 < ttft_sum < 6 * 1.0
        assert metric_sum(samples, "gen_ai_client_token_usage_sum", gen_ai_token_type="output") == out_tokens
        chat_tokens = sum(s["output"] for s in seen[:6])
        assert metric_sum(samples, "slogate_inter_token_latency_seconds_count") == chat_tokens - 6
        assert metric_sum(samples, "slogate_inflight_requests") == 0
        assert metric_sum(samples, "slogate_inflight_tokens") == 0
        assert metric_sum(samples, "slogate_gateway_overhead_seconds_count") == n
        assert "slogate_event_loop_lag_seconds" in samples
        # on the proxy port /metrics belongs to the upstream (relayed), since an admin port is set
        assert b"vllm:num_requests_running" in get(gw.url + "/metrics")

        status_doc = get_json(admin + "/slogate/status")
        one = status_doc["windows"]["1m"]
        assert one["requests"] == n and one["errors"] == 1
        assert abs(one["output_tokens_per_s"] * one["span_s"] - out_tokens) < 1e-6 * out_tokens + 0.01
        assert one["slos"]["loose"]["attainment"] == pytest.approx((n - 1) / n)
        assert one["slos"]["impossible"]["attainment"] == 0
        assert one["slos"]["loose"]["goodput_tokens_per_s"] * one["span_s"] == pytest.approx(out_tokens)
        assert 0.010 < one["ttft"]["p50"] < 1.0 and one["ttft"]["count"] == 6
        assert one["e2e"]["p99"] >= one["e2e"]["p50"] > 0
        assert status_doc["windows"]["5m"]["requests"] == n

        records = trace_records(trace_dir, n)
        written_bytes = [get(admin + "/metrics"), get(admin + "/slogate/status")]
        gw.stop(signal.SIGTERM)
        log = gw.log_text()

    trace = read_trace(trace_dir)
    assert len(trace.records) == n and trace.header.source == "gateway" and trace.header.salt_id
    chats = [r for r in records if r.endpoint == "/v1/chat/completions" and r.status == 200]
    assert [r.output_tokens for r in chats] == [s["output"] for s in seen[:6]]
    assert all(r.tokens_source == "usage" and r.ttft and r.tpot and r.stream for r in chats)
    assert all(r.hash_ids and len(r.hash_ids) >= 2 for r in chats)
    assert len({r.hash_ids[0] for r in chats}) == 1  # the shared system prompt: equal first blocks
    assert len({tuple(r.hash_ids) for r in chats}) == 6  # different questions: different last blocks
    comps = [r for r in records if r.endpoint == "/v1/completions"]
    assert [r.output_tokens for r in comps] == [4, 4, 4] and not any(r.stream for r in comps)
    assert [r.input_tokens for r in comps] == [s["input"] for s in seen[6:]]
    bad = [r for r in records if r.status == 404]
    assert len(bad) == 1 and bad[0].error == "upstream_status" and bad[0].model == "nope"
    assert all(r.model in (SIM_MODEL, "nope") for r in records)
    assert "trace closed" in log

    # privacy canary: nowhere in what the gateway wrote
    dctx = zstandard.ZstdDecompressor()
    for path in trace_dir.iterdir():
        raw = path.read_bytes()
        assert CANARY.encode() not in raw
        with dctx.stream_reader(raw, read_across_frames=True) as reader:
            assert CANARY.encode() not in reader.read()
    for blob in written_bytes:
        assert CANARY.encode() not in blob
    assert CANARY not in log
    assert "127.0.0.1:" + str(gw.port) not in log.replace(f"listening on 127.0.0.1:{gw.port}", "")
