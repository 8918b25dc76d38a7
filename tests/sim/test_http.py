"""Every simulator endpoint over real HTTP, with aiohttp and with the official openai SDK."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import orjson
import pytest

from tests.sim.conftest import parse_sse
from tests.sim.realclient import hist_quantile, raw_streams

MODEL = "llama-3-8b"


def words(n: int) -> str:
    """A prompt of exactly n tokens for the built-in tokenizer."""
    return " ".join(["abcd"] * n)


async def post(http: aiohttp.ClientSession, url: str, body: dict, **kw) -> tuple[int, bytes]:
    async with http.post(url, json=body, **kw) as r:
        return r.status, await r.read()


async def test_chat_stream_shapes(sim_constant, http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": words(10)}], "max_tokens": 6,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(sim_constant.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = parse_sse(await r.read())
    assert events[-1] == "[DONE]"
    first, *deltas, usage, _ = events
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(deltas) == 6
    assert all(d["choices"][0]["finish_reason"] is None for d in deltas[:-1])
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    # chat template: 4 tokens per message + 3 for the reply header; no prompt_tokens_details with 0 cached
    # tokens (vLLM reports them only when not 0, and drops the null key from the usage chunk)
    assert usage["usage"] == {"prompt_tokens": 10 + 4 + 3, "completion_tokens": 6, "total_tokens": 23}
    text = "".join(d["choices"][0]["delta"]["content"] for d in deltas)
    tok = await post(http, sim_constant.url + "/tokenize", {"model": MODEL, "prompt": text})
    assert orjson.loads(tok[1])["count"] == 6  # generated text re-tokenizes to its length


async def test_completions_stream_and_timing(sim_constant, http):
    body = {"model": MODEL, "prompt": words(32), "max_tokens": 20, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    times = []
    async with http.post(sim_constant.url + "/v1/completions", json=body) as r:
        buf = b""
        async for chunk in r.content.iter_any():
            buf += chunk
            times.extend([time.perf_counter()] * chunk.count(b'"text":"'))
    events = parse_sse(buf)
    texts = [e for e in events if e != "[DONE]"]
    assert len(texts) == 20 and texts[0]["object"] == "text_completion"
    assert texts[-1]["choices"][0]["finish_reason"] == "length"
    ttft = times[0] - t0
    assert 0.035 < ttft < 0.2
    e2e = times[-1] - t0
    assert 0.04 + 19 * 0.005 - 0.01 < e2e < 0.6


async def test_non_stream_bodies(sim_constant, http):
    st, raw = await post(http, sim_constant.url + "/v1/chat/completions",
                         {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                          "ignore_eos": True})
    assert st == 200
    body = orjson.loads(raw)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4
    st, raw = await post(http, sim_constant.url + "/v1/completions", {"model": MODEL, "prompt": "abcd efgh"})
    body = orjson.loads(raw)
    assert body["usage"]["prompt_tokens"] == 2
    assert 1 <= body["usage"]["completion_tokens"] <= 16  # completions default max_tokens = 16


async def test_seeded_length_and_min_tokens(sim_constant, http):
    lens = []
    for _ in range(6):
        _, raw = await post(http, sim_constant.url + "/v1/completions",
                            {"model": MODEL, "prompt": "x", "max_tokens": 40, "min_tokens": 5})
        body = orjson.loads(raw)
        n = body["usage"]["completion_tokens"]
        assert 5 <= n <= 40
        assert body["choices"][0]["finish_reason"] == ("length" if n == 40 else "stop")
        lens.append(n)


async def test_models_health_version_tokenize(sim_constant, http):
    async with http.get(sim_constant.url + "/v1/models") as r:
        models = await r.json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 8192
    async with http.get(sim_constant.url + "/health") as r:
        assert r.status == 200
    async with http.get(sim_constant.url + "/version") as r:
        assert "version" in await r.json()
    st, raw = await post(http, sim_constant.url + "/tokenize", {"model": MODEL, "prompt": words(7)})
    tok = orjson.loads(raw)
    assert tok["count"] == 7 and tok["max_model_len"] == 8192 and len(tok["tokens"]) == 7
    _, raw = await post(http, sim_constant.url + "/tokenize",
                        {"model": MODEL, "messages": [{"role": "user", "content": words(5)}]})
    assert orjson.loads(raw)["count"] == 5 + 4 + 3
    st, raw = await post(http, sim_constant.url + "/detokenize", {"model": MODEL, "tokens": tok["tokens"][:2]})
    assert st == 200 and isinstance(orjson.loads(raw)["prompt"], str)


async def test_embeddings(sim_constant, http):
    st, raw = await post(http, sim_constant.url + "/v1/embeddings",
                         {"model": MODEL, "input": [words(3), words(5), "abcdefgh"]})
    body = orjson.loads(raw)
    assert st == 200 and len(body["data"]) == 3
    assert body["usage"]["prompt_tokens"] == 3 + 5 + 2


async def test_errors_like_vllm(sim_constant, http):
    st, raw = await post(http, sim_constant.url + "/v1/chat/completions",
                         {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    err = orjson.loads(raw)["error"]
    assert st == 404 and err["type"] == "NotFoundError" and err["message"] == "The model `nope` does not exist."
    assert err["code"] == 404
    st, raw = await post(http, sim_constant.url + "/v1/completions", {"model": MODEL, "prompt": words(9000)})
    err = orjson.loads(raw)["error"]
    assert st == 400 and err["type"] == "BadRequestError"
    assert "maximum context length is 8192 tokens" in err["message"] and "9000 input tokens" in err["message"]
    st, raw = await post(http, sim_constant.url + "/v1/completions",
                         {"model": MODEL, "prompt": words(100), "max_tokens": 8100})
    err = orjson.loads(raw)["error"]
    assert st == 400 and err["message"].startswith("'max_tokens' or 'max_completion_tokens' is too large: 8100.")
    async with http.post(sim_constant.url + "/v1/completions", data=b"{not json") as r:
        assert r.status == 400 and "error" in await r.json()


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"max_tokens": True}, "max_tokens", "'max_tokens' must be an integer, got True."),  # was echoed as usage
    ({"max_tokens": 2.5}, "max_tokens", "'max_tokens' must be an integer, got 2.5."),
    ({"n": 0}, "n", "n must be at least 1, got 0."),
    ({"n": 2}, "n", "The simulator supports n=1 only."),
    ({"max_tokens": 3, "min_tokens": 10}, "min_tokens", "min_tokens must be less than or equal to max_tokens=3, got 10."),
    ({"stream_options": {"include_usage": True}}, "stream_options",
     "Stream options can only be defined when `stream=True`."),
    ({"stream": "maybe"}, "stream", "'stream' must be a boolean, got 'maybe'."),
    ({"prompt": []}, "prompt", "The decoder prompt cannot be empty."),
    ({"prompt": [5, 128256]}, "prompt", "Token id 128256 is out of vocabulary"),
])
async def test_bad_fields_are_400s_naming_them(sim_constant, http, fields, param, message):
    """Each request field checked as vLLM checks it: a 400 in OpenAI's shape naming the field."""
    st, raw = await post(http, sim_constant.url + "/v1/completions", {"model": MODEL, "prompt": "abc", **fields})
    err = orjson.loads(raw)["error"]
    assert (st, err["type"], err["param"], err["message"]) == (400, "BadRequestError", param, message)


@pytest.mark.parametrize(("fields", "tokens", "streamed"), [
    ({"max_tokens": 5.0}, 5, False), ({"max_tokens": "5"}, 5, False),  # pydantic's lax mode, as vLLM reads them
    ({"max_tokens": 4, "stream": "false"}, 4, False), ({"max_tokens": 4, "stream": "true"}, 4, True),
    ({"max_tokens": 3, "stream": 1, "stream_options": {"include_usage": True}}, 3, True),
])
async def test_fields_read_as_vllm_reads_them(sim_constant, http, fields, tokens, streamed):
    body = {"model": MODEL, "prompt": "abc", "ignore_eos": "yes", **fields}
    async with http.post(sim_constant.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        assert r.content_type == ("text/event-stream" if streamed else "application/json")
        raw = await r.read()
    if streamed:
        events = parse_sse(raw)
        assert sum(1 for e in events if isinstance(e, dict) and e.get("choices")) == tokens
        if "stream_options" in fields:
            assert [e["usage"]["completion_tokens"] for e in events if isinstance(e, dict) and e.get("usage")] == [tokens]
    else:
        assert orjson.loads(raw)["usage"]["completion_tokens"] == tokens


async def test_metrics_vllm_names(sim_constant, http):
    await post(http, sim_constant.url + "/v1/completions",
               {"model": MODEL, "prompt": "abc", "max_tokens": 3, "ignore_eos": True, "stream": True})
    async with http.get(sim_constant.url + "/metrics") as r:
        text = await r.text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                 "slogate_sim_emit_lag_seconds_bucket"):
        assert name in text, name
    assert 'model_name="llama-3-8b"' in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="llama-3-8b"}' in text
    assert 'finished_reason="length"' in text


async def _samples(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value of every vllm: sample on /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {(smp.name, smp.labels.get("le", "")): smp.value for fam in text_string_to_metric_families(text)
            for smp in fam.samples if smp.name.startswith("vllm:")}


async def test_per_request_histograms_like_vllm_v1(sim_constant, http):
    """vLLM V1's per-request histograms, from one request (1 prompt token, 3 generated, max_tokens 3) on the
    constant-timing sim (TTFT 40 ms, ITL 5 ms): prefill = scheduled → first token, decode = first → last
    token, inference = their sum; token counts in 1-2-5 buckets up to max_model_len (8192)."""
    before = await _samples(http, sim_constant.url)
    st, _ = await post(http, sim_constant.url + "/v1/completions",
                       {"model": MODEL, "prompt": "abc", "max_tokens": 3, "ignore_eos": True, "stream": True})
    assert st == 200
    after = await _samples(http, sim_constant.url)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    for name in ("prefill_time_seconds", "decode_time_seconds", "inference_time_seconds", "prompt_tokens",
                 "generation_tokens", "params_max_tokens", "params_n"):
        assert delta[(f"vllm:request_{name}_count", "")] == 1, name
    assert delta[("vllm:request_prompt_tokens_bucket", "1.0")] == 1
    assert delta[("vllm:request_generation_tokens_bucket", "2.0")] == 0
    assert delta[("vllm:request_generation_tokens_bucket", "5.0")] == 1
    assert delta[("vllm:request_params_max_tokens_bucket", "2.0")] == 0
    assert delta[("vllm:request_params_max_tokens_bucket", "5.0")] == 1
    assert delta[("vllm:request_params_n_bucket", "1.0")] == 1
    assert ("vllm:request_prompt_tokens_bucket", "5000.0") in after
    assert ("vllm:request_prompt_tokens_bucket", "10000.0") not in after
    prefill = delta[("vllm:request_prefill_time_seconds_sum", "")]
    decode = delta[("vllm:request_decode_time_seconds_sum", "")]
    queue = delta[("vllm:request_queue_time_seconds_sum", "")]
    assert decode == pytest.approx(0.010, abs=0.002)  # two 5 ms gaps
    assert queue + prefill == pytest.approx(0.040, abs=0.003)  # the 40 ms TTFT
    assert delta[("vllm:request_inference_time_seconds_sum", "")] == pytest.approx(prefill + decode, abs=1e-6)


@pytest.mark.parametrize(("method", "path", "status", "detail", "allow"), [
    ("GET", "/v1/chat/completions", 405, "Method Not Allowed", "POST"),
    ("POST", "/v1/models", 405, "Method Not Allowed", "HEAD, GET"),
    ("GET", "/v1/nothing", 404, "Not Found", None),
])
async def test_unknown_paths_and_methods_answer_json_like_vllm(sim_constant, http, method, path, status, detail, allow):
    """vLLM's FastAPI app answers these with a JSON body, not aiohttp's plain text."""
    async with http.request(method, sim_constant.url + path, json={}) as r:
        assert (r.status, r.content_type, await r.json()) == (status, "application/json", {"detail": detail})
        assert r.headers.get("Allow") == allow


async def test_disconnect_aborts_and_frees_blocks(sim_roofline, http):
    body = {"model": MODEL, "prompt": words(500), "max_tokens": 4000, "ignore_eos": True, "stream": True}
    async with http.post(sim_roofline.url + "/v1/completions", json=body) as r:
        await r.content.readany()
    # response closed early: the engine must drop the request and free its KV blocks
    text = ""
    for _ in range(50):
        await asyncio.sleep(0.05)
        async with http.get(sim_roofline.url + "/metrics") as m:
            text = await m.text()
        if 'vllm:num_requests_running{engine="0",model_name="llama-3-8b"} 0.0' in text:
            break
    assert 'vllm:num_requests_running{engine="0",model_name="llama-3-8b"} 0.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="llama-3-8b"} 0.0' in text
    assert 'finished_reason="abort"' in text


async def test_prefix_cache_over_http(sim_roofline, http):
    shared = words(320)
    for i in range(3):
        await post(http, sim_roofline.url + "/v1/completions",
                   {"model": MODEL, "prompt": shared + f" q{i}", "max_tokens": 2, "ignore_eos": True})
    async with http.get(sim_roofline.url + "/metrics") as m:
        text = await m.text()
    hits = [ln for ln in text.splitlines() if ln.startswith("vllm:prefix_cache_hits_total")]
    assert float(hits[0].split()[-1]) >= 2 * 320


def test_openai_sdk_sync(sim_constant):
    client = openai.OpenAI(base_url=sim_constant.url + "/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=5, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"
    comp = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
    assert comp.usage.completion_tokens == 3
    emb = client.embeddings.create(model=MODEL, input=["a b", "c"])
    assert len(emb.data) == 2 and emb.usage.prompt_tokens == 3
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=words(9000))


async def test_openai_sdk_async_stream(sim_constant):
    client = openai.AsyncOpenAI(base_url=sim_constant.url + "/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=7, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    content, usage, reasons = [], None, []
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                content.append(c.delta.content)
            reasons.append(c.finish_reason)
    assert len(content) == 7 and usage.completion_tokens == 7 and reasons[-1] == "length"
    comp = await client.completions.create(model=MODEL, prompt="hi", max_tokens=4, stream=True,
                                           extra_body={"ignore_eos": True})
    texts = [c.choices[0].text async for c in comp]
    assert len(texts) == 4
    await client.close()


async def test_replicas_and_served_model_name(sim_server, http):
    sim = sim_server(replicas=2, timing="constant", ttft_ms=5, itl_ms=1, served_model_name="my-model")
    assert len(sim.urls) == 2 and sim.urls[0] == sim.url
    for i, url in enumerate(sim.urls):
        st, raw = await post(http, url + "/v1/completions", {"model": "my-model", "prompt": "x", "max_tokens": 2})
        assert st == 200 and orjson.loads(raw)["model"] == "my-model"
        async with http.get(url + "/metrics") as r:
            assert f'engine="{i}"' in await r.text()
    st, _ = await post(http, sim.urls[1] + "/v1/completions", {"model": MODEL, "prompt": "x"})
    assert st == 404


@pytest.mark.slow
async def test_500_streams_emission_error(sim_server):
    """The real clock keeps 500 concurrent streams on schedule (server-side measurement)."""
    sim = sim_server(seed=1)
    got = await raw_streams(sim.port, 500, 100)
    assert got == 500 * 100
    async with aiohttp.ClientSession() as http, http.get(sim.url + "/metrics") as r:
        text = await r.text()
    p50 = hist_quantile(text, "slogate_sim_emit_lag_seconds", 0.5)
    assert p50 < 0.010  # typically ~1–2 ms; generous for a shared, noisy machine
