"""With a tokenizer configured, the gateway's input tokens equal llama.cpp's own prompt_tokens (±1)
although its streams carry no usage (issue 20): the gateway renders the Gemma template and counts
through the server's `/extras/tokenize`, or with the GGUF's own tokenizer built offline into a
`tokenizer.json` (tests/gateway/tokens_gguf.py), off the hot path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.fixtures_gateway import http_request, start_gateway, trace_records
from tests.gateway.tokens_gguf import build_tokenizer_json
from tests.realservers import GEMMA_GGUF, LLAMA_BAN_EOS, MODEL_CACHE, gemma_model_path, start_llama

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(240)]

PROMPTS = ["Write a short story about a lighthouse keeper and the sea.",
           "List three prime numbers, then explain why 1 is not prime, in plain words: " * 4,
           "Translate 'good morning' into French, Spanish and German.\nAnswer briefly."]
JSON = {"Content-Type": "application/json"}


def _chat(url: str, text: str, *, stream: bool) -> dict | None:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": stream,
            "logit_bias": LLAMA_BAN_EOS}
    status, _, data = http_request(url, "POST", "/v1/chat/completions", json.dumps(body).encode(), JSON, timeout=120)
    assert status == 200, data[:200]
    return None if stream else json.loads(data)


def gemma_tokenizer_json() -> Path:
    """The GGUF's tokenizer as a tokenizer.json, built once offline next to the model."""
    return build_tokenizer_json(gemma_model_path(), MODEL_CACHE / GEMMA_GGUF.replace(".gguf", ".tokenizer.json"))


def test_gguf_tokenizer_json_tokenizes_as_llama_cpp() -> None:
    import llama_cpp
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(gemma_tokenizer_json()))
    llm = llama_cpp.Llama(str(gemma_model_path()), vocab_only=True, verbose=False)
    for text in [*PROMPTS, "Ünïcödé 日本語 🙂 <start_of_turn>user\nhi<end_of_turn>\n"]:
        assert tok.encode(text).ids == llm.tokenize(text.encode(), add_bos=True, special=True)


@pytest.mark.parametrize("mode", ["file", "server", "estimate"])
def test_gateway_input_tokens_equal_llama_cpp_prompt_tokens(tmp_path: Path, mode: str) -> None:
    estimate = mode == "estimate"
    tokenizer = str(gemma_tokenizer_json()) if mode == "file" else None
    with start_llama() as llama:
        server_counts = [_chat(llama.url, p, stream=False)["usage"]["prompt_tokens"] for p in PROMPTS]
        args = ["--trace-dir", str(tmp_path / "trace")]
        if not estimate:
            args += ["--tokenizer", tokenizer or llama.url + "/extras/tokenize", "--chat-template", "gemma"]
        with start_gateway(llama.url, *args) as gw:
            for p in PROMPTS:
                _chat(gw.url, p, stream=True)
            records = sorted(trace_records(tmp_path / "trace", len(PROMPTS), timeout=20), key=lambda r: r.t)
    got = [r.input_tokens for r in records]
    if estimate:  # no usage in llama.cpp streams: bytes/4, flagged, and off by more than one token
        assert all(r.input_estimated for r in records)
        assert any(abs(g - s) > 1 for g, s in zip(got, server_counts, strict=True)), (got, server_counts)
    else:
        assert not any(r.input_estimated for r in records)
        assert all(abs(g - s) <= 1 for g, s in zip(got, server_counts, strict=True)), (got, server_counts)
