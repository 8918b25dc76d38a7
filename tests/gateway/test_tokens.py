"""Exact input tokens in the gateway when the upstream sends no usage (gateway/tokens.py): the sim's
/tokenize counts them off the hot path and the record is no longer marked estimated; without a
tokenizer the bytes/4 estimate stays flagged. Templates render as the servers do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.gateway.tokens import render
from slogate.replay.sim import tokenizer as sim_tok
from tests.gateway.fixtures_gateway import http_request, start_gateway, trace_records
from tests.simserver import start_sim

MESSAGES = [{"role": "user", "content": "tell me a story about the sea and the old lighthouse keeper " * 3}]


def _stream(url: str) -> None:
    body = json.dumps({"model": "llama-3-8b", "messages": MESSAGES, "max_tokens": 3, "stream": True}).encode()
    status, _, _ = http_request(url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    assert status == 200


@pytest.mark.parametrize("tokenizer", [True, False])
def test_gateway_counts_input_tokens_when_the_stream_has_no_usage(tmp_path: Path, tokenizer: bool) -> None:
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        args = ["--no-inject-usage", "--trace-dir", str(tmp_path)]
        args += ["--tokenizer", sim.url + "/tokenize"] if tokenizer else []
        with start_gateway(sim.url, *args) as gw:
            for _ in range(3):
                _stream(gw.url)
            records = trace_records(tmp_path, 3)
    exact = len(sim_tok.chat_pieces(MESSAGES))
    if tokenizer:
        assert [(r.input_tokens, r.input_estimated) for r in records] == [(exact, False)] * 3
    else:  # bytes/4, flagged
        assert all(r.input_estimated and r.input_tokens != exact for r in records)


def test_templates_render_as_the_servers_do() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]}
    assert render(body, "gemma") == ("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
                                     "<start_of_turn>model\n", True)
    assert render(body, "none") == ("hiyo", False)  # content only: the count stays flagged estimated
    assert render({"prompt": "abc"}, "chatml") == ("abc", True)
    assert render({"input": [1, 2]}, "gemma") is None
