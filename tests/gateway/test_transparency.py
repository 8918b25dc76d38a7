"""Through the gateway a client sees what it would see directly: the official `openai` SDK and raw
HTTP against two identically seeded simulators, one behind `slogate gateway`, one direct.

Chat and completions, streaming and not, with and without `stream_options.include_usage` (the
usage chunk the gateway injects never reaches a client that did not ask). Responses must match
byte for byte once the simulator's random ids and creation times are blanked.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import orjson
import pytest

from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, normalize, start_gateway
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "Tell me about lighthouses."}]
PROMPT = "Tell me about lighthouses."


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[str, str]]:
    """(direct URL, gateway URL) in front of two simulators with the same seed."""
    with (
        start_sim(timing="constant", ttft_ms=15, itl_ms=2, seed=7) as direct,
        start_sim(timing="constant", ttft_ms=15, itl_ms=2, seed=7) as behind,
        start_gateway(behind.url) as gw,
    ):
        yield direct.url, gw.url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def _strip(obj: dict) -> dict:
    obj = dict(obj)
    obj.pop("id", None)
    obj.pop("created", None)
    return obj


def _sdk_calls(client: openai.OpenAI) -> list:
    """The same sequence of SDK calls, returned as comparable plain data."""
    out: list = []
    for usage in (False, True):
        opts = {"stream_options": {"include_usage": True}} if usage else {}
        chunks = list(client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=9, stream=True,
                                                     **opts))
        out.append([_strip(c.model_dump()) for c in chunks])
        chunks = list(client.completions.create(model=SIM_MODEL, prompt=PROMPT, max_tokens=7, stream=True, **opts))
        out.append([_strip(c.model_dump()) for c in chunks])
    out.append(_strip(client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=5).model_dump()))
    out.append(_strip(client.completions.create(model=SIM_MODEL, prompt=PROMPT, max_tokens=5).model_dump()))
    return out


def test_openai_sdk_same_results_direct_and_through_gateway(pair):
    direct_url, gw_url = pair
    direct, via = _sdk_calls(_client(direct_url)), _sdk_calls(_client(gw_url))
    assert via == direct
    chat_plain, comp_plain, chat_usage, comp_usage = via[:4]
    # no usage chunk for the client that did not ask, exactly one for the one that did
    assert all(c["usage"] is None for c in chat_plain + comp_plain)
    assert chat_usage[-1]["usage"]["completion_tokens"] == 9 and chat_usage[-1]["choices"] == []
    assert comp_usage[-1]["usage"]["completion_tokens"] == 7
    assert sum(1 for c in chat_plain if c["choices"] and c["choices"][0]["delta"]["content"]) == 9


def _raw(url: str, path: str, body: dict) -> tuple[int, dict[str, str], bytes]:
    return http_request(url, "POST", path, orjson.dumps(body),
                        {"Authorization": "Bearer sk-test", "X-Custom": "1", "Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 12, "stream": True}),
        ("/v1/chat/completions", {"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 6, "stream": True,
                                  "stream_options": {"include_usage": True}}),
        ("/v1/completions", {"model": SIM_MODEL, "prompt": PROMPT, "max_tokens": 6, "stream": True}),
        ("/v1/completions", {"model": SIM_MODEL, "prompt": PROMPT, "max_tokens": 6}),
        ("/v1/embeddings", {"model": SIM_MODEL, "input": ["a b c", "d e"]}),
        ("/v1/chat/completions", {"model": "no-such-model", "messages": MESSAGES}),  # upstream 404 relayed
    ],
)
def test_raw_bytes_status_and_headers_match(pair, path, body):
    direct_url, gw_url = pair
    d_status, d_headers, d_body = _raw(direct_url, path, body)
    g_status, g_headers, g_body = _raw(gw_url, path, body)
    assert g_status == d_status
    assert normalize(g_body) == normalize(d_body)
    if body.get("stream"):
        assert b"usage" not in g_body or "stream_options" in body
    ignore = {"date", "transfer-encoding", "content-length", "connection", "keep-alive"}
    assert {k.lower(): v for k, v in g_headers.items() if k.lower() not in ignore} == {
        k.lower(): v for k, v in d_headers.items() if k.lower() not in ignore
    }


def test_unmeasured_paths_are_relayed(pair):
    direct_url, gw_url = pair
    d, g = http_request(direct_url, "GET", "/v1/models"), http_request(gw_url, "GET", "/v1/models?x=1")
    assert g[0] == d[0] == 200
    assert [m["id"] for m in orjson.loads(g[2])["data"]] == [m["id"] for m in orjson.loads(d[2])["data"]]
    for path in ("/health", "/no/such/path"):
        assert http_request(gw_url, "GET", path)[0] == http_request(direct_url, "GET", path)[0]
    head_direct, head_via = http_request(direct_url, "HEAD", "/v1/models"), http_request(gw_url, "HEAD", "/v1/models")
    assert head_via[0] == head_direct[0] and head_via[2] == b""
    assert head_via[1].get("Content-Length") == head_direct[1].get("Content-Length")
