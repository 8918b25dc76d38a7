"""Trace statistics on hand-made records and on the bundled samples."""

from __future__ import annotations

import pytest

from slogate.traces import formats, samples
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.stats import trace_stats


def test_hand_made() -> None:
    records = [
        RequestRecord(t=0.0, input_tokens=10, output_tokens=1, hash_ids=[1, 2]),
        RequestRecord(t=1.0, input_tokens=20, output_tokens=3, hash_ids=[1, 3]),
        RequestRecord(t=3.0, input_tokens=30, output_tokens=5, hash_ids=[1, 3, 4], status=429),
    ]
    s = trace_stats(records)
    assert s.requests == 3 and s.duration_s == 3.0
    assert s.mean_rps == pytest.approx(2 / 3)  # two intervals over 3 s: what `replay --rate 0.667` would make
    assert s.interarrival_cv == pytest.approx(0.5 / 1.5)
    assert (s.input_tokens.mean, s.input_tokens.p50) == (20.0, 20.0)
    assert s.output_tokens.p99 == pytest.approx(4.96)
    assert s.prefix_reuse == pytest.approx(3 / 7)
    assert s.errors == 1


def test_empty_and_no_hash_ids() -> None:
    s = trace_stats([])
    assert s.requests == 0 and s.mean_rps is None and s.prefix_reuse is None and s.input_tokens.mean is None
    assert trace_stats([RequestRecord(t=0.0, input_tokens=5)]).prefix_reuse is None


def test_samples() -> None:
    s = trace_stats(formats.load(samples.path(samples.AZURE_CONV))[1])
    assert s.requests == 2867 and s.duration_s == pytest.approx(600.0, abs=1.0)
    assert s.input_tokens.mean == pytest.approx(1146.6, abs=0.1) and s.prefix_reuse is None
    m = trace_stats(formats.load(samples.path(samples.MOONCAKE_CONVERSATION))[1])
    assert m.requests == 1750 and m.prefix_reuse == pytest.approx(0.284, abs=0.001)
    b = trace_stats(formats.load(samples.path(samples.BURSTGPT))[1])
    assert b.requests == 54 and b.duration_s == 3293.0 and b.errors == 3


def test_ideal_prefix_reuse_counts_matched_full_blocks_only() -> None:
    """With a known block size a request reuses min(k × block_tokens, input) tokens: the tokens after
    its last matching full block (the partial block at a turn's end) are new, as in vLLM's prefix cache."""
    from slogate.traces.stats import block_tokens, ideal_prefix_reuse

    first = RequestRecord(t=0.0, input_tokens=150, hash_ids=[1, 2])  # 2 full 64-token blocks + 22 tokens
    second = RequestRecord(t=1.0, input_tokens=200, hash_ids=[1, 2, 3])  # its first 2 blocks continue the first
    assert ideal_prefix_reuse([first, second], 64) == pytest.approx(128 / 350)
    assert ideal_prefix_reuse([first, second]) == pytest.approx(200 * 2 / 3 / 350)  # block size unknown
    assert block_tokens(TraceHeader(block_size=256, block_unit="bytes")) == 64
    assert block_tokens(TraceHeader(block_size=16, block_unit="tokens")) == 16


def test_implausible_arrival_names_the_first_one_past_a_year() -> None:
    from slogate.traces.stats import MAX_SPAN_S, implausible_arrival, span_text

    assert implausible_arrival([0.0, 86_400.0, MAX_SPAN_S]) is None  # a year is still a trace
    assert implausible_arrival([5.0, 6.0, 1.7e9, 1e300]) == (2, 1.7e9, 5.0)
    assert implausible_arrival([float("nan"), 1.0, float("inf"), 1e300]) == (3, 1e300, 1.0)  # non-finite: validate's own
    assert implausible_arrival([]) is None
    assert (span_text(1.7e9), span_text(3 * 86400), span_text(1e297)) == ("53.9 years", "3 days", "3.17e+289 years")


def test_one_mean_rate_on_every_surface(tmp_path) -> None:
    """`replay --rate 3` makes 3 req/s; the run's offered rate and `trace stats` of its records read 3 back
    (trace stats once divided n by the span: 3.005 here, 2 req/s for two requests a second apart)."""
    from slogate.cli import main as slogate
    from slogate.replay.results import load
    from slogate.traces import formats
    from tests.servers import REPO

    out = tmp_path / "run"
    assert slogate(["replay", str(REPO / "traces" / "samples" / "azure_conv_10min.csv"), "--rate", "3", "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--quiet", "--out", str(out)]) == 0
    _, records = formats.load(out / "requests.jsonl.zst")
    assert len(records) > 1000
    assert load(out).summary.offered_rate_rps == pytest.approx(3.0, rel=1e-9)
    assert trace_stats(records).mean_rps == pytest.approx(3.0, rel=1e-9)
