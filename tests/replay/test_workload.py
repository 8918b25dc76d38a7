"""Workload transforms and synthetic profiles: pure functions, checked without any server."""

from __future__ import annotations

import itertools
import statistics

import pytest

from slogate.replay import workload as wl
from slogate.replay.profiles import synthesize
from slogate.replay.workload import PlannedRequest, WorkloadError
from tests.replay.conftest import AZURE


def reqs(times: list[float]) -> list[PlannedRequest]:
    return [PlannedRequest(t=t, input_tokens=10 + i, output_tokens=5, index=i, hash_ids=[i]) for i, t in enumerate(times)]


def test_window_shifts_and_reindexes() -> None:
    out = wl.window(reqs([0, 1, 2, 3, 4]), 1, 3)
    assert [r.t for r in out] == [0, 1]
    assert [r.input_tokens for r in out] == [11, 12]
    assert [r.index for r in out] == [0, 1]
    with pytest.raises(WorkloadError):
        wl.window(reqs([0, 1]), 3, 1)


def test_speed_and_rate() -> None:
    base = reqs([0, 2, 4, 6, 8])
    assert [r.t for r in wl.speed(base, 2)] == [0, 1, 2, 3, 4]
    assert wl.mean_rate(wl.rate(base, 10)) == pytest.approx(10)
    with pytest.raises(WorkloadError):
        wl.speed(base, 0)


def test_sample_is_seeded_and_keeps_times() -> None:
    base = reqs([i * 0.1 for i in range(2000)])
    a, b = wl.sample(base, 0.25, 7), wl.sample(base, 0.25, 7)
    assert [r.t for r in a] == [r.t for r in b]
    assert 400 < len(a) < 600
    assert wl.sample(base, 0.25, 8) != a


def test_duration_loop_gives_fresh_prefixes() -> None:
    base = reqs([0, 1, 2, 3])  # period 4 s
    out = wl.duration(base, 10, loop=True)
    assert [r.t for r in out] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert out[4].input_tokens == out[0].input_tokens
    assert out[4].hash_ids != out[0].hash_ids  # a repeat is not an artificial 100 % cache hit
    assert len({r.seed_key for r in out}) == len(out)
    assert [r.t for r in wl.duration(base, 2.5)] == [0, 1, 2]


def test_warmup_and_shard() -> None:
    base = wl.mark_warmup(reqs([0, 1, 2, 3, 4, 5]), count=2)
    assert [r.warmup for r in base] == [True, True, False, False, False, False]
    assert [r.warmup for r in wl.mark_warmup(reqs([0, 1, 2, 3]), seconds=1.5)] == [True, True, False, False]
    shards = [wl.shard(base, i, 3) for i in range(3)]
    assert sorted(r.index for s in shards for r in s) == list(range(6))
    assert [r.t for r in shards[1]] == [1, 4]  # intended times kept
    with pytest.raises(WorkloadError):
        wl.parse_shard("3/3")


def test_parsers() -> None:
    assert wl.parse_window("10m:20m") == (600, 1200)
    assert wl.parse_window("5:") == (5, None)
    assert wl.parse_seconds("250ms") == pytest.approx(0.25)
    with pytest.raises(WorkloadError):
        wl.parse_window("600")


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.parametrize(("spec", "cv"), [("poisson:rate=50", 1.0), ("gamma:rate=50,cv=3", 3.0),
                                          ("gamma:rate=50,burstiness=0.25", 0.5), ("constant:rate=50", 0.0)])
def test_synthetic_rates_and_cv(spec: str, cv: float) -> None:
    w = synthesize(spec, requests=20000, seed=3, input_tokens="fixed:10", output_tokens="fixed:2")
    gaps = _gaps([r.t for r in w.requests])
    assert 1 / statistics.fmean(gaps) == pytest.approx(50, rel=0.05 if cv < 2 else 0.12)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, abs=0.05 + 0.1 * cv)


def test_synthetic_lengths_and_concurrency() -> None:
    w = synthesize("poisson:rate=5", duration_s=100, seed=1, input_tokens="uniform:10,20",
                   output_tokens="lognormal:median=100,sigma=0.5")
    assert all(10 <= r.input_tokens <= 20 for r in w.requests)
    assert statistics.median(r.output_tokens for r in w.requests) == pytest.approx(100, rel=0.15)
    assert max(r.t for r in w.requests) < 100
    c = synthesize("concurrency:c=4", requests=10)
    assert c.concurrency == 4 and len(c.requests) == 10
    with pytest.raises(WorkloadError):
        synthesize("zipf:rate=1")
    with pytest.raises(WorkloadError):
        synthesize("poisson:rate=-1")


def test_empirical_lengths_from_trace() -> None:
    w = synthesize("constant:rate=10", requests=500, seed=2,
                   input_tokens=f"empirical:{AZURE}",
                   output_tokens=f"empirical:{AZURE}")
    lines = AZURE.read_text().split("\n")[1:]
    inputs = {int(x.split(",")[1]) for x in lines if x}
    assert {r.input_tokens for r in w.requests} <= inputs
