"""The response model (gen_ai.response.model) read by StreamObserver from the upstream's bytes:
the first SSE chunk's "model" (one bytes.find, no decode), or the JSON body's."""

from __future__ import annotations

import orjson
import pytest

from slogate.traces.observer import MAX_MODEL_BYTES, StreamObserver


def _stream(chunks: list[bytes], piece: int | None = None) -> StreamObserver:
    obs = StreamObserver(0, stream=True)
    body = b"".join(b"data: " + c + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    step = piece or len(body)
    for i in range(0, len(body), step):
        obs.feed(body[i : i + step], 1000 + i)
    return obs


def _chunk(model: object, content: str = "hi", **extra: object) -> bytes:
    return orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "model": model,
                         "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}], **extra})


@pytest.mark.parametrize("piece", [None, 1, 7])
def test_model_of_the_first_chunk_at_any_split(piece: int | None) -> None:
    obs = _stream([_chunk("meta-llama/Llama-3.1-8B-Instruct"), _chunk("later-ignored")], piece)
    assert obs.finish(5000, status=200).response_model == "meta-llama/Llama-3.1-8B-Instruct"


def test_key_inside_generated_text_is_not_the_model() -> None:
    # The completion text holds `"model": "fake"`; its quotes are escaped, so only the real key matches.
    first = orjson.dumps({"choices": [{"delta": {"content": '"model": "fake"'}}], "model": "real"})
    assert _stream([first]).finish(5000, status=200).response_model == "real"


def test_escaped_and_unicode_model_names() -> None:
    assert _stream([_chunk('we"ird\\name')]).finish(1, status=200).response_model == 'we"ird\\name'
    assert _stream([_chunk("modèle-7b")]).finish(1, status=200).response_model == "modèle-7b"
    spaced = b'{"model" :  "spaced", "choices": [{"delta": {"content": "x"}}]}'
    assert _stream([spaced]).finish(1, status=200).response_model == "spaced"


@pytest.mark.parametrize("value", [None, 7, "", "x" * (MAX_MODEL_BYTES + 1)])
def test_no_usable_model_gives_none(value: object) -> None:
    assert _stream([_chunk(value)]).finish(1, status=200).response_model is None


def test_absent_model_and_only_the_first_chunk_is_read() -> None:
    no_model = orjson.dumps({"choices": [{"delta": {"content": "x"}}]})
    assert _stream([no_model, _chunk("second")]).finish(1, status=200).response_model is None


def test_non_streaming_body_model() -> None:
    obs = StreamObserver(0, stream=False)
    body = orjson.dumps({"id": "x", "model": "served-name", "choices": [{"message": {"content": "hello"},
                                                                          "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    obs.feed(body, 10)
    record = obs.finish(20, status=200)
    assert record.response_model == "served-name"
    assert record.output_tokens == 2
