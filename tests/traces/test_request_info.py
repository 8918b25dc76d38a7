"""Reading request fields once, injecting include_usage, and canonical prompt bytes."""

from __future__ import annotations

import orjson

from slogate.traces.request_info import prompt_bytes, request_info, with_usage_requested


def test_chat_request_info():
    body = {"model": "m", "stream": True, "max_tokens": 64, "messages": [{"role": "user", "content": "x" * 40}]}
    info = request_info("/v1/chat/completions", body)
    assert (info.model, info.stream, info.max_tokens, info.include_usage) == ("m", True, 64, False)
    assert info.est_input_tokens == 10
    body["stream_options"] = {"include_usage": True}
    assert request_info("/v1/chat/completions", body).include_usage


def test_max_completion_tokens_and_embeddings():
    assert request_info("/v1/chat/completions", {"max_completion_tokens": 7}).max_tokens == 7
    info = request_info("/v1/embeddings", {"input": ["a", "b", "c"]})
    assert info.n_inputs == 3
    assert request_info("/v1/embeddings", {"input": "a"}).n_inputs == 1
    assert request_info("/v1/embeddings", {"input": [1, 2, 3]}).n_inputs == 1  # one tokenized input


def test_malformed_bodies_do_not_raise():
    for body in (None, [], "x", 3, {"messages": "notalist"}, {"messages": [1, None]}, {"max_tokens": True}):
        info = request_info("/v1/chat/completions", body)
        assert info.max_tokens is None or isinstance(info.max_tokens, int)
        prompt_bytes(body)


def test_with_usage_requested_keeps_other_options():
    body = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}}
    new = orjson.loads(with_usage_requested(body))
    assert new["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert "include_usage" not in body["stream_options"]  # the original is untouched


def test_prompt_bytes_prefix_property():
    a = {"messages": [{"role": "system", "content": "S" * 300}, {"role": "user", "content": "q1"}]}
    b = {"messages": [{"role": "system", "content": "S" * 300}, {"role": "user", "content": "q2"}]}
    pa, pb = prompt_bytes(a), prompt_bytes(b)
    assert pa[:300] == pb[:300] and pa != pb
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert prompt_bytes(parts) == prompt_bytes({"messages": [{"role": "user", "content": "hello"}]})
    assert prompt_bytes({"prompt": "abc"}) == b"abc"
