"""Prompt-length conventions against the sim (issue 20): `server` lengths are the server's
prompt_tokens (template included), `content` lengths are the message's own tokens; the requests the
replay sends before the run are counted by kind; `--model` against a path-like model list warns."""

from __future__ import annotations

import pytest

from slogate.replay.profiles import synthesize
from slogate.replay.run import ReplayOptions, replay
from slogate.replay.sim import tokenizer as sim_tok
from slogate.replay.target import check_model
from slogate.traces.usage import UsageError
from tests.simserver import start_sim

TEMPLATE = sim_tok.CHAT_MESSAGE_TOKENS + sim_tok.CHAT_REPLY_TOKENS


def _run(url: str, **kw):
    w = synthesize("concurrency:c=2", requests=6, input_tokens="fixed:120", output_tokens="fixed:4")
    return replay(w, ReplayOptions(target=url, endpoint="chat", **kw))


def test_server_and_content_conventions_differ_by_the_template() -> None:
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        server = _run(sim.url)
        content = _run(sim.url, prompt_tokens="content")
    assert server.results.environment.prompt_tokens == "server"
    assert content.results.environment.prompt_tokens == "content"
    assert {r.input_tokens for r in server.records} == {120}  # the server's count is the planned length
    assert {r.input_tokens for r in content.records} == {120 + TEMPLATE}  # the content is; the server adds its template
    # the sim has /tokenize: no calibration chat in content mode, only tokenize calls, all counted
    traffic = content.results.environment.warmup_traffic
    assert traffic.get("tokenize", 0) > 0 and "calibration_chat" not in traffic
    assert server.results.environment.warmup_traffic.get("tokenize", 0) > 0
    # lengths checked on the target's tokenizer before the run, as each convention counts them
    assert server.results.environment.prompt_lengths_checked == "6 of 6 exact on server:/tokenize"
    assert content.results.environment.prompt_lengths_checked == "6 of 6 exact on server:/tokenize"
    # content plans leave the template out; the drift compares plan + what the server adds (counted on its
    # /tokenize, no chat sent), so an exact run shows none (it read 19 % drift, every request "off")
    assert content.results.environment.prompt_added_tokens == TEMPLATE
    for out in (server, content):
        s = out.results.summary
        assert (s.input_token_drift, s.input_drift_requests, s.unreachable_requests) == (0.0, 0, 0)


def test_no_calibrate_sends_no_chat_and_needs_a_tokenizer() -> None:
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        out = _run(sim.url, tokenizer="server", calibrate=False, prompt_tokens="content")
        assert set(out.results.environment.warmup_traffic) == {"tokenize"}
        # server lengths: the template is measured on /tokenize (messages), still without a chat (it was not:
        # every prompt 127 tokens for 120 planned, "(inexact)")
        out = _run(sim.url, tokenizer="server", calibrate=False)
        env = out.results.environment
        assert set(env.warmup_traffic) == {"tokenize"} and not env.tokenizer.endswith("(inexact)")
        assert {r.input_tokens for r in out.records} == {120} and out.results.summary.input_token_drift == 0.0
        with pytest.raises(UsageError, match="--no-calibrate needs a tokenizer"):
            _run(sim.url, calibrate=False)


def test_model_check_warns_on_path_like_ids() -> None:
    assert check_model("gemma", ["gemma"], "u") is None
    assert "accept any name" in (check_model("gemma", ["/models/gemma-3-270m.gguf"], "u") or "")
    with pytest.raises(UsageError, match="fix --model"):
        check_model("gemma", ["meta-llama/Llama-3.1-8B"], "u")
