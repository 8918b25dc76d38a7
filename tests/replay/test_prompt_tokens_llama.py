"""On llama.cpp (no usage in streams) the replay checks its prompt lengths on the server's own
tokenizer (`/extras/tokenize`) before the run, and `--prompt-tokens content` needs no calibration chat."""

from __future__ import annotations

import pytest

from slogate.replay.profiles import synthesize
from slogate.replay.run import ReplayOptions, replay
from tests.realservers import start_llama

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(240)]


def test_content_lengths_are_checked_on_llama_cpp_tokenizer() -> None:
    w = synthesize("concurrency:c=1", requests=3, input_tokens="fixed:60", output_tokens="fixed:2")
    with start_llama() as llama:
        out = replay(w, ReplayOptions(target=llama.url, endpoint="chat", prompt_tokens="content", calibrate=False,
                                      tokenizer="server", model="gemma"))
    env = out.results.environment
    assert env.prompt_lengths_checked == "3 of 3 exact on server:/extras/tokenize"
    assert set(env.warmup_traffic) == {"tokenize"}  # no calibration chat reached the server
    assert out.results.summary.failed == 0


def test_a_tokenizer_file_without_the_servers_bos_is_calibrated_on_the_server(tmp_path) -> None:
    """`--tokenizer FILE` whose file adds no BOS (llama.cpp adds one): the words count alike, the overhead
    does not. It is measured on the server (two completions), so every completions prompt is exact;
    before, each was one token long (5 → 6, 300 → 301) while the run said "exact"."""
    from tokenizers import Tokenizer

    from tests.gateway.tokens_gguf import build_tokenizer_json
    from tests.realservers import GEMMA_GGUF, MODEL_CACHE, gemma_model_path

    full = build_tokenizer_json(gemma_model_path(), MODEL_CACHE / GEMMA_GGUF.replace(".gguf", ".tokenizer.json"))
    tok = Tokenizer.from_file(str(full))
    tok.post_processor = None  # no BOS
    bare = tmp_path / "no-bos.tokenizer.json"
    tok.save(str(bare))
    w = synthesize("concurrency:c=1", requests=3, input_tokens="uniform:5,300", output_tokens="fixed:2")
    with start_llama() as llama:
        out = replay(w, ReplayOptions(target=llama.url, endpoint="completions", stream=False, tokenizer=str(bare),
                                      model="gemma"))
    planned = sorted(r.input_tokens for r in w.requests)
    assert sorted(r.input_tokens for r in out.records) == planned  # the server's usage.prompt_tokens
    s = out.results.summary
    assert (s.input_token_drift, s.failed) == (0.0, 0)
    assert out.results.environment.warmup_traffic == {"calibration_completion": 2}  # the two overhead lengths
    assert out.results.environment.prompt_lengths_checked == f"3 of 3 exact on file:{bare}"  # as the server counts
