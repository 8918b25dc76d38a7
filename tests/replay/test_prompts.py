"""Prompt synthesis: exact token counts on the sim's tokenizer, equal text for equal hash ids,
different text for different ids; calibration over HTTP against the sim's /tokenize."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from slogate.replay.prompts import PromptBuilder, calibrate
from slogate.replay.sim import tokenizer as sim_tok
from slogate.replay.tokenizers import probe_server_tokenizer
from slogate.replay.workload import PlannedRequest
from tests.simserver import start_sim


class SimCounter:
    """The sim's built-in tokenizer in-process (completions prompt; chat adds its template)."""

    name = "test:sim"

    async def count(self, text: str) -> int:
        return sim_tok.count(text)

    async def count_chat(self, text: str) -> int | None:
        return len(sim_tok.chat_pieces([{"role": "user", "content": text}]))


def plan(chat: bool = False, block_size: int = 64):
    return asyncio.run(calibrate(SimCounter(), chat=chat, seed=5, block_size=block_size))


def test_exact_lengths_and_prefix_identity() -> None:
    p = plan()
    assert p.exact and p.base_tokens == 0 and len(p.vocab) >= 16
    b = PromptBuilder(p)
    shared = PlannedRequest(t=0, input_tokens=150, output_tokens=1, hash_ids=[1, 2, 3], index=0)
    same_prefix = PlannedRequest(t=0, input_tokens=200, output_tokens=1, hash_ids=[1, 2, 9, 10], index=1)
    other = PlannedRequest(t=0, input_tokens=150, output_tokens=1, hash_ids=[7, 2, 3], index=2)
    ta, tb, tc = b.text(shared), b.text(same_prefix), b.text(other)
    assert [sim_tok.count(t) for t in (ta, tb, tc)] == [150, 200, 150]
    pa, pb, pc = sim_tok.pieces(ta), sim_tok.pieces(tb), sim_tok.pieces(tc)
    assert pa[:128] == pb[:128]  # blocks 1 and 2 (64 tokens each) are the same text
    assert pa[128:135] != pb[128:135]  # block 3 vs block 9 differ
    assert pa[:64] != pc[:64]  # different first id: different text from the first block on
    # the same plan and seed in another builder (another worker) gives the same text
    assert PromptBuilder(p).text(shared) == ta


@pytest.mark.parametrize("n", [1, 2, 7, 63, 64, 65, 1000, 4096])
def test_every_length_is_exact(n: int) -> None:
    b = PromptBuilder(plan())
    assert sim_tok.count(b.text(PlannedRequest(t=0, input_tokens=n, output_tokens=1, hash_ids=[4, 5], index=n))) == n


def test_chat_overhead_is_subtracted() -> None:
    p = plan(chat=True)
    assert p.exact and p.base_tokens == sim_tok.CHAT_MESSAGE_TOKENS + sim_tok.CHAT_REPLY_TOKENS
    b = PromptBuilder(p)
    for n in (7, 8, 300):
        text = b.text(PlannedRequest(t=0, input_tokens=n, output_tokens=1, index=n))
        assert len(sim_tok.chat_pieces([{"role": "user", "content": text}])) == n


def test_unique_tails_differ_between_requests() -> None:
    b = PromptBuilder(plan())
    a = b.text(PlannedRequest(t=0, input_tokens=100, output_tokens=1, index=1))
    c = b.text(PlannedRequest(t=0, input_tokens=100, output_tokens=1, index=2))
    assert a != c


def test_calibration_over_http_against_sim_tokenize() -> None:
    async def go(url: str):
        async with aiohttp.ClientSession() as s:
            counter = await probe_server_tokenizer(s, url, "llama-3-8b", {})
            assert counter is not None and counter.name == "server:/tokenize"
            p = await calibrate(counter, chat=True, seed=1, block_size=512)
            b = PromptBuilder(p)
            text = b.text(PlannedRequest(t=0, input_tokens=1234, output_tokens=1, hash_ids=[1, 2, 3], index=0))
            return p, await counter.count_chat(text)

    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        p, n = asyncio.run(go(sim.url))
    assert p.exact and n == 1234


@pytest.mark.parametrize("vocab_size", [17, 256, 300])
def test_word_draws_use_the_whole_vocabulary_and_extend_as_prefixes(vocab_size: int) -> None:
    """Words come from a keyed XOF stream: any vocabulary size (two bytes per word above 256), every
    word reachable, and a longer draw of a block starts with the shorter one (cache extension)."""
    from slogate.replay.prompts import PromptPlan

    b = PromptBuilder(PromptPlan(vocab=[f"w{i}" for i in range(vocab_size)], base_tokens=0, seed=3, block_size=64))
    short, long = b._draw("3:7", 50), b._draw("3:7", 20_000)
    assert long[:50] == short and len(long) == 20_000
    assert len(set(long)) == vocab_size
    assert b._draw("3:8", 50) != short
