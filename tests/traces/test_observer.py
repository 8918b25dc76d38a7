"""StreamObserver against recorded stream shapes of vLLM, SGLang, TGI and llama.cpp servers,
split at every byte boundary (hypothesis), in LF and CRLF, with and without usage stripping."""

from __future__ import annotations

import itertools
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate.traces.observer import StreamObserver
from slogate.traces.record import is_error
from tests.traces.stream_shapes import SHAPES, VLLM_CHAT_USAGE

EVENT_END = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r(?!\n))")


def _pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(body)})
    bounds = [0, *points, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def _observe(body: bytes, cuts: list[int], *, strip: bool = False):
    """Feed pieces timestamped with their end offset, so times are byte positions."""
    obs = StreamObserver(0, stream=True, strip_usage=strip, keep_chunk_times=True)
    out = b""
    pos = 0
    for piece in _pieces(body, cuts):
        pos += len(piece)
        out += obs.feed(piece, pos)
    out += obs.flush()
    return obs.finish(len(body) + 1, status=200), out


def _output_event_ends(body: bytes) -> list[int]:
    """Byte offsets where output-bearing events end, found by decoding every event (reference)."""
    ends = []
    start = 0
    for m in EVENT_END.finditer(body):
        event = body[start : m.start()]
        start = m.end()
        data = b"\n".join(
            line[5:].removeprefix(b" ") for line in re.split(rb"\r\n|\n|\r", event) if line.startswith(b"data:")
        )
        if not data or data == b"[DONE]":
            continue
        obj = orjson.loads(data)
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            text = choice.get("text") or delta.get("content") or delta.get("reasoning_content")
            if text or delta.get("tool_calls"):
                ends.append(m.end())
                break
    return ends


@pytest.mark.parametrize(("name", "body", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_shape_whole(name, body, expected):
    chunks, tokens, source, finish, error = expected
    record, _ = _observe(body, [])
    assert len(record.chunk_times) == chunks
    assert record.output_tokens == tokens
    assert record.tokens_source == source
    assert record.finish_reason == finish
    assert record.error == error


@pytest.mark.parametrize(("name", "body", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_shape_every_single_split(name, body, expected):
    whole, _ = _observe(body, [])
    ends = _output_event_ends(body)
    assert len(ends) == expected[0]
    for cut in range(1, len(body)):
        record, _ = _observe(body, [cut])
        assert record.output_tokens == whole.output_tokens
        assert record.finish_reason == whole.finish_reason
        assert record.error == whole.error
        # each output event is seen when the piece holding its terminator arrives
        want = [cut if end <= cut else len(body) for end in ends]
        assert [round(t * 1e9) for t in record.chunk_times] == want


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(SHAPES),
    st.lists(st.integers(min_value=1, max_value=2000), max_size=40),
)
def test_shape_any_splits(shape, cuts):
    _, body, expected = shape
    record, forwarded = _observe(body, cuts)
    assert forwarded == body  # without stripping, bytes pass unchanged
    assert record.output_tokens == expected[1]
    assert record.finish_reason == expected[3]
    points = [*sorted({c for c in cuts if 0 < c < len(body)}), len(body)]
    first_end = _output_event_ends(body)[0]
    piece_end = next(p for p in points if p >= first_end)
    assert record.ttft == pytest.approx(piece_end * 1e-9)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(VLLM_CHAT_USAGE) - 1), max_size=30))
def test_strip_usage_removes_only_the_usage_chunk(cuts):
    record, forwarded = _observe(VLLM_CHAT_USAGE, cuts, strip=True)
    expected = re.sub(rb'data: \{[^\n]*"choices":\[\],"usage"[^\n]*\n\n', b"", VLLM_CHAT_USAGE)
    assert forwarded == expected
    assert b'"usage":{' not in forwarded
    assert record.output_tokens == 3 and record.tokens_source == "usage" and record.input_tokens == 12


def test_crlf_variant_of_every_shape():
    for name, body, expected in SHAPES:
        crlf = body.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
        record, _ = _observe(crlf, [7, 50, 51, 52])
        assert record.output_tokens == expected[1], name
        assert record.finish_reason == expected[3], name


def test_timings_ttft_tpot_itl_e2e():
    body = VLLM_CHAT_USAGE
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    obs = StreamObserver(1_000_000_000, stream=True)
    times = [1_050_000_000, 1_100_000_000, 1_120_000_000, 1_150_000_000, 1_151_000_000, 1_152_000_000]
    for ev, t in zip(events, times, strict=True):
        obs.feed(ev, t)
    rec = obs.finish(1_160_000_000, status=200)
    assert rec.ttfb == pytest.approx(0.05)  # role chunk is the first byte ...
    assert rec.ttft == pytest.approx(0.10)  # ... but not the first token
    assert rec.e2e == pytest.approx(0.16)
    assert rec.tpot == pytest.approx((0.16 - 0.10) / (3 - 1))
    assert rec.itl.count == 2 and rec.itl.max == pytest.approx(0.03)


def test_incomplete_stream_is_an_error():
    body = VLLM_CHAT_USAGE[:200]
    record, _ = _observe(body, [])
    assert record.error == "incomplete_stream"


def test_non_streaming_body_usage_and_estimate():
    body = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "x" * 40}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 9, "completion_tokens": 11}})
    obs = StreamObserver(0, stream=False)
    obs.feed(body[:10], 5)
    obs.feed(body[10:], 6)
    rec = obs.finish(7, status=200)
    assert (rec.output_tokens, rec.input_tokens, rec.tokens_source, rec.ttft) == (11, 9, "usage", None)
    no_usage = orjson.dumps({"choices": [{"text": "y" * 40, "finish_reason": "length"}]})
    obs = StreamObserver(0, stream=False, endpoint="/v1/completions")
    obs.feed(no_usage, 5)
    rec = obs.finish(7, status=200)
    assert (rec.output_tokens, rec.tokens_source, rec.finish_reason) == (10, "estimate", "length")


def test_embeddings_count_inputs():
    body = orjson.dumps({"object": "list", "data": [{"embedding": [0.1], "index": i} for i in range(3)],
                         "usage": {"prompt_tokens": 12, "total_tokens": 12}})
    obs = StreamObserver(0, stream=False, endpoint="/v1/embeddings")
    obs.feed(body, 3)
    rec = obs.finish(4, status=200)
    assert rec.n_inputs == 3 and rec.input_tokens == 12 and rec.output_tokens is None


def test_http_error_status_is_classified():
    obs = StreamObserver(0, stream=True)
    obs.feed(b'{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}', 1)
    rec = obs.finish(2, status=400)
    assert rec.error == "upstream_status" and rec.status == 400


def test_finish_reason_abort_without_error_event_is_aborted():
    obs = StreamObserver(0, stream=True)
    obs.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n', 1)
    obs.feed(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}\n\ndata: [DONE]\n\n', 2)
    rec = obs.finish(3, status=200)
    assert rec.error == "aborted" and rec.finish_reason == "abort" and is_error(rec)


def test_error_event_is_stream_error_event_not_aborted():
    obs = StreamObserver(0, stream=True)
    obs.feed(b'data: {"error":{"message":"engine died","code":500}}\n\ndata: [DONE]\n\n', 1)
    rec = obs.finish(2, status=200)
    assert rec.error == "stream_error_event" and rec.finish_reason == "error"
