"""Long SSE events in the observer: time linear in the event size, an oversized event relayed byte for
byte without parsing (and counted), and the usage-strip hold-back bounded by `max_event_bytes`."""

from __future__ import annotations

import random
import time

import pytest

from slogate.traces.observer import StreamObserver

PIECE = 64 << 10
CHUNK = b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n'
FINAL = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'


def _long_event(size: int) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"' + b"a" * size + b'"},"finish_reason":null}]}\n\n'


def _feed(obs: StreamObserver, body: bytes, piece: int) -> bytes:
    out = [obs.feed(body[i : i + piece], i) for i in range(0, len(body), piece)]
    out.append(obs.flush())
    return b"".join(out)


def _seconds(size: int, **kw) -> float:
    body = CHUNK + _long_event(size) + FINAL + b"data: [DONE]\n\n"
    obs = StreamObserver(0, stream=True, **kw)
    pieces = [body[i : i + PIECE] for i in range(0, len(body), PIECE)]
    t0 = time.perf_counter()
    for i, piece in enumerate(pieces):
        obs.feed(piece, i)
    obs.flush()
    return time.perf_counter() - t0


def _reference_seconds(size: int) -> float:
    """Linear work over the same pieces in the same run: join them once and scan the result."""
    body = CHUNK + _long_event(size) + FINAL + b"data: [DONE]\n\n"
    pieces = [body[i : i + PIECE] for i in range(0, len(body), PIECE)]
    t0 = time.perf_counter()
    b"".join(pieces).find(b"\n\n", len(CHUNK))
    return time.perf_counter() - t0


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_a_long_line_costs_time_linear_in_its_size():
    ref40 = min(_reference_seconds(40 << 20) for _ in range(3))
    for kw in ({}, {"strip_usage": True}, {"max_event_bytes": 64 << 20}):  # skipped; parsed at the end
        t10, t20, t40 = (min(_seconds(mib << 20, **kw) for _ in range(3)) for mib in (10, 20, 40))
        # quadratic (the old re-copy per piece) was 1.2 / 3.8 / 15.4 s: 12.8x from 10 to 40 MiB and
        # hundreds of times one join; linear is ~4x (more when 40 MiB no longer fits the CPU caches)
        # and a few joins' worth
        assert t40 < 3 and t40 / max(t10, 1e-3) < 12 and t40 < 40 * ref40 + 0.05, (kw, t10, t20, t40, ref40)


def test_oversized_event_is_relayed_unparsed_and_counted_and_the_rest_still_observed():
    long = _long_event(300_000)
    body = CHUNK + long + CHUNK + USAGE + FINAL + b"data: [DONE]\n\n"
    rng = random.Random(7)
    for strip in (False, True):
        for _ in range(20):
            obs = StreamObserver(0, stream=True, strip_usage=strip, max_event_bytes=100_000)
            out, i = [], 0
            while i < len(body):
                n = rng.choice((1, 2, 3, 50, 4096, 70_000))
                out.append(obs.feed(body[i : i + n], i))
                i += n
            out.append(obs.flush())
            rec = obs.finish(len(body), status=200)
            assert obs.oversized_events == 1
            assert b"".join(out) == (body.replace(USAGE, b"") if strip else body)
            assert rec.error is None and rec.finish_reason == "stop" and rec.output_tokens == 4


def test_strip_mode_holds_back_at_most_max_event_bytes():
    obs = StreamObserver(0, stream=True, strip_usage=True, max_event_bytes=1 << 20)
    body = _long_event(8 << 20)
    held, most = 0, 0
    for i in range(0, len(body), PIECE):
        piece = body[i : i + PIECE]
        held += len(piece) - len(obs.feed(piece, i))
        most = max(most, held)
    assert most <= (1 << 20) + PIECE and held == 0
