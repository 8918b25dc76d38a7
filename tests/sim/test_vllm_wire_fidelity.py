"""Details of vLLM's OpenAI server the sim must reproduce on the wire, each checked over real HTTP:
malformed bodies, `stream_options` defaults, `usage.prompt_tokens_details`, body keys, /ping and /load,
empty prompts, `"max_tokens": null` on completions, and the /metrics Content-Type."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from tests.servers import Server
from tests.sim.conftest import parse_sse
from tests.simserver import start_sim

MODEL = "llama-3-8b"
CHAT = {"messages": [{"role": "user", "content": "abcd"}]}
COMPLETION = {"prompt": "abcd"}


@pytest.fixture(scope="module")
def fast() -> Iterator[Server]:
    """Constant timing, a 40-token context (so "the rest of the context" is a short stream)."""
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1, extra_args=["--max-model-len", "40"]) as s:
        yield s


@pytest.fixture(scope="module")
def cached() -> Iterator[Server]:
    """Roofline timing with prefix caching, reporting cached prompt tokens."""
    with start_sim(seed=1, extra_args=["--enable-prompt-tokens-details"]) as s:
        yield s


async def post(http: aiohttp.ClientSession, url: str, body: dict, **kw) -> tuple[int, bytes]:
    async with http.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}, **kw) as r:
        return r.status, await r.read()


def usage_events(raw: bytes) -> list[dict]:
    return [e["usage"] for e in parse_sse(raw) if isinstance(e, dict) and "usage" in e]


# -- stream_options ------------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "usage_chunks"), [
    ({}, 1),  # vLLM's StreamOptions.include_usage defaults to true
    ({"continuous_usage_stats": False}, 1),
    ({"include_usage": True}, 1),
    ({"include_usage": False}, 0),
    ({"include_usage": None}, 0),
    ({"include_usage": "false"}, 0),  # lax mode, as pydantic reads it
])
@pytest.mark.parametrize(("path", "fields"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_stream_options_include_usage_defaults_to_true(fast, http, path, fields, options, usage_chunks):
    st, raw = await post(http, fast.url + path, {"model": MODEL, "max_tokens": 3, "ignore_eos": True, "stream": True,
                                                 "stream_options": options, **fields})
    assert st == 200
    assert usage_events(raw) == [{"prompt_tokens": 1 if path == "/v1/completions" else 8, "total_tokens": 4 + (
        0 if path == "/v1/completions" else 7), "completion_tokens": 3}] * usage_chunks


# -- usage.prompt_tokens_details -----------------------------------------------------------------

async def test_prompt_tokens_details_null_without_the_flag(fast, http):
    """vLLM's UsageInfo always has the key in a non-streaming body; it is null unless the server reports
    cached tokens."""
    for path, fields in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        st, raw = await post(http, fast.url + path, {"model": MODEL, "max_tokens": 2, **fields})
        assert st == 200
        assert orjson.loads(raw)["usage"]["prompt_tokens_details"] is None


async def test_prompt_tokens_details_only_when_tokens_were_cached(cached, http):
    """With --enable-prompt-tokens-details vLLM reports `cached_tokens` only when it is not 0: null in a
    body, no key at all in the usage chunk (dumped with exclude_none)."""
    prefix = " ".join(f"w{i:03d}" for i in range(64))  # 4 full blocks of 16 tokens
    url = cached.url + "/v1/completions"
    st, raw = await post(http, url, {"model": MODEL, "prompt": prefix + " x1", "max_tokens": 2, "ignore_eos": True})
    assert st == 200 and orjson.loads(raw)["usage"]["prompt_tokens_details"] is None
    st, raw = await post(http, url, {"model": MODEL, "prompt": "frsh " + prefix, "max_tokens": 2, "ignore_eos": True,
                                     "stream": True, "stream_options": {"include_usage": True}})
    assert st == 200 and usage_events(raw) == [{"prompt_tokens": 65, "total_tokens": 67, "completion_tokens": 2}]
    st, raw = await post(http, url, {"model": MODEL, "prompt": prefix + " x2", "max_tokens": 2, "ignore_eos": True})
    assert st == 200 and orjson.loads(raw)["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    st, raw = await post(http, url, {"model": MODEL, "prompt": prefix + " x3", "max_tokens": 2, "ignore_eos": True,
                                     "stream": True, "stream_options": {"include_usage": True}})
    assert st == 200
    assert usage_events(raw) == [{"prompt_tokens": 65, "total_tokens": 67, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 64}}]


# -- body keys -----------------------------------------------------------------------------------

async def test_non_streaming_body_keys_like_vllm(fast, http):
    """ChatCompletionResponse has a top-level `prompt_logprobs`; CompletionResponse has it per choice only."""
    _, raw = await post(http, fast.url + "/v1/chat/completions", {"model": MODEL, "max_tokens": 2, **CHAT})
    assert list(orjson.loads(raw)) == ["id", "object", "created", "model", "choices", "service_tier",
                                       "system_fingerprint", "usage", "prompt_logprobs", "kv_transfer_params"]
    _, raw = await post(http, fast.url + "/v1/completions", {"model": MODEL, "max_tokens": 2, **COMPLETION})
    body = orjson.loads(raw)
    assert list(body) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "kv_transfer_params"]
    assert body["choices"][0]["prompt_logprobs"] is None


# -- request bodies ------------------------------------------------------------------------------

async def test_malformed_json_is_a_bad_request(fast, http):
    for data in (b"{not json", b"", b"[1, 2]"):
        async with http.post(fast.url + "/v1/completions", data=data, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            err = (await r.json())["error"]
            assert (err["type"], err["code"], err["param"]) == ("Bad Request", 400, None)


# -- /ping, /load, /metrics ----------------------------------------------------------------------

async def test_ping_answers_like_health(fast, http):
    for method in ("GET", "POST"):
        async with http.request(method, fast.url + "/ping") as r:
            assert r.status == 200 and await r.read() == b""


async def test_load_counts_requests_in_flight(fast, http):
    async def load() -> int:
        async with http.get(fast.url + "/load") as r:
            assert r.status == 200 and r.content_type == "application/json"
            return (await r.json())["server_load"]

    assert await load() == 0
    body = {"model": MODEL, "prompt": "abcd", "max_tokens": 30, "ignore_eos": True, "stream": True}
    async with http.post(fast.url + "/v1/completions", json=body) as r:
        await r.content.readany()
        assert await load() == 1
        await r.read()
    for _ in range(100):  # the handler finishes just after the last byte
        if await load() == 0:
            break
        await asyncio.sleep(0.01)
    assert await load() == 0


async def test_metrics_content_type_is_the_text_format(fast, http):
    async with http.get(fast.url + "/metrics") as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


# -- prompts and lengths -------------------------------------------------------------------------

@pytest.mark.parametrize("prompt", ["", [""]])
async def test_an_empty_prompt_is_a_400_naming_it(cached, http, prompt):
    """Used to reach the engine with 0 prompt tokens: "does not fit in the KV cache" on the roofline."""
    for stream in (False, True):
        st, raw = await post(http, cached.url + "/v1/completions",
                             {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream})
        err = orjson.loads(raw)["error"]
        assert (st, err["message"], err["param"]) == (400, "The decoder prompt cannot be empty.", "prompt")


async def test_completions_max_tokens_null_is_the_rest_of_the_context(fast, http):
    """CompletionRequest.max_tokens defaults to 16, but an explicit null leaves it unset: vLLM then caps the
    output at what is left of the context (here 40 - 1)."""
    fields = {"model": MODEL, "prompt": "abcd", "ignore_eos": True}
    _, raw = await post(http, fast.url + "/v1/completions", fields)
    assert orjson.loads(raw)["usage"]["completion_tokens"] == 16
    _, raw = await post(http, fast.url + "/v1/completions", {**fields, "max_tokens": None})
    assert orjson.loads(raw)["usage"]["completion_tokens"] == 39
