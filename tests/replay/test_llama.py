"""Faithful requests against a real inference server: llama.cpp (llama-cpp-python) serving Gemma 3 270M.

Prompt lengths are matched on the real SentencePiece tokenizer through `/extras/tokenize` (words
that are one token each, additive across block boundaries), chat-template overhead is calibrated
from `usage.prompt_tokens`, and output length is forced by banning Gemma's end tokens (the server
ignores `ignore_eos`). Non-streaming, because this server sends no usage in streams.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from slogate.replay.profiles import synthesize
from slogate.replay.prompts import PromptBuilder, calibrate
from slogate.replay.run import ReplayOptions, replay
from slogate.replay.tokenizers import probe_server_tokenizer
from slogate.replay.workload import PlannedRequest
from tests.realservers import start_llama

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_prompt_synthesis_is_exact_on_llama_cpp_tokenizer() -> None:
    async def go(url: str) -> tuple[bool, list[int], list[int]]:
        async with aiohttp.ClientSession() as s:
            counter = await probe_server_tokenizer(s, url, None, {})
            assert counter is not None and counter.name == "server:/extras/tokenize"
            plan = await calibrate(counter, chat=False, seed=3, block_size=64)
            b = PromptBuilder(plan)
            want = [5, 64, 65, 300, 777]
            got = [await counter.count(b.text(PlannedRequest(t=0, input_tokens=n, output_tokens=1,
                                                               hash_ids=[1, 2, 3, 4], index=n))) for n in want]
            return plan.exact, want, got

    with start_llama() as server:
        exact, want, got = asyncio.run(go(server.url))
    assert exact and got == want


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_replay_against_llama_cpp_has_no_drift(endpoint: str) -> None:
    w = synthesize("constant:rate=1", requests=3, seed=2, input_tokens="uniform:40,120", output_tokens="uniform:5,12")
    with start_llama() as server:
        out = replay(w, ReplayOptions(target=server.url, endpoint=endpoint, stream=False))
    s, env = out.results.summary, out.results.environment
    assert s.failed == 0 and env.server_kind == "llamacpp" and env.output_forcing == "logit_bias"
    assert s.input_token_drift == 0 and s.output_token_drift == 0
    assert [r.input_tokens for r in out.records] == [r.input_tokens for r in w.requests]
