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
