"""Differences that are real: `slogate compare` gives each latency delta a seeded bootstrap CI from the
per-request records. Real virtual-time replays on the sim (step-time jitter 5 %): two seeds of the same
setup differ only by noise (nothing significant); a GPU with less HBM bandwidth (TPOT ≈ 30 % slower on
this memory-bound load) is flagged; `--fail-if '…!'` fails only on a significant change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.compare import flatten, intervals, load_side
from tests.replay.test_compare_runs import make_trace, replay

BASE = "sim:h100-sxm/llama-3-8b?max_num_seqs=4&jitter=0.05&seed={seed}"
SLOW = BASE + "&gpu_set=hbm_tb_s=2.3"  # less HBM bandwidth: TPOT ≈ 1.3× (part of the step does not scale)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("significance")
    trace = make_trace(d / "t.jsonl.zst", rate=40, seconds=6)
    return {"a": replay(trace, d / "a", target=BASE.format(seed=1)),
            "b": replay(trace, d / "b", target=BASE.format(seed=2)),
            "slow": replay(trace, d / "slow", target=SLOW.format(seed=3))}


def compare_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    status = slogate(["compare", *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_same_setup_different_seeds_is_not_significant(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, data = compare_json(capsys, str(runs["a"]), str(runs["b"]))
    assert status == 0
    rows = data["metrics"]
    for metric in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "e2e_s.p99"):
        assert rows[metric]["relative"][0] != 0, metric  # the seeds really differ
        (low, high), = rows[metric]["ci"]
        assert low <= 0 <= high, (metric, low, high)
        assert rows[metric]["significant"] == [False], metric
    assert rows["request_rate_rps"]["ci"] == [None] and rows["request_rate_rps"]["significant"] == [None]


def test_slower_tpot_is_flagged_significant(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, data = compare_json(capsys, str(runs["a"]), str(runs["b"]), str(runs["slow"]))
    row = data["metrics"]["tpot_s.p50"]
    assert row["relative"][1] == pytest.approx(0.3, abs=0.06)
    assert row["significant"] == [False, True]
    low, high = row["ci"][1]
    assert 0 < low <= row["delta"][1] <= high
    assert data["metrics"]["tpot_s.p99"]["significant"][1] is True


def test_fail_if_bang_requires_significance(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b, slow = (str(runs[k]) for k in ("a", "b", "slow"))
    # a noise-level change: the plain bound breaks (any increase), the '!' bound does not
    base, noisy = flatten(load_side(a).results.summary), flatten(load_side(b).results.summary)
    up = next(m for m in ("tpot_s.p99", "tpot_s.p50", "ttft_s.p99", "ttft_s.p50", "e2e_s.p99") if noisy[m] > base[m])
    assert slogate(["compare", a, b, "--fail-if", f"{up}>+0%"]) == 1
    assert slogate(["compare", a, b, "--fail-if", f"{up}>+0%!"]) == 0
    assert "OK: all 1 bound(s) hold" in capsys.readouterr().out
    assert slogate(["compare", a, slow, "--fail-if", "tpot_s.p99>+10%!"]) == 1
    assert "broken" in capsys.readouterr().out
    assert slogate(["compare", a, slow, "--fail-if", "tpot_s.p99>+50%!"]) == 0  # significant but under the bound


def test_bang_on_a_metric_without_records_is_a_usage_error(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["compare", str(runs["a"]), str(runs["b"]), "--fail-if", "goodput_rps<-5%!"]) == 2
    err = capsys.readouterr().err
    assert "goodput_rps<-5%!" in err and "per-request latency" in err and len(err.strip().splitlines()) == 1


def test_cis_are_seeded(runs: dict[str, Path]) -> None:
    sides = [load_side(runs["a"]), load_side(runs["slow"])]
    assert intervals(sides, seed=7) == intervals(sides, seed=7)
    assert intervals(sides, seed=7) != intervals(sides, seed=8)


@pytest.mark.parametrize("numpy", [True, False])
def test_both_resampling_paths_agree_on_what_is_real(runs: dict[str, Path], numpy: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The vectorized (numpy) and the pure-Python bootstrap give the same verdicts on real runs."""
    import sys

    from slogate.replay.significance import bootstrap_deltas, significant

    if not numpy:
        monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` raises ImportError
    a, b, slow = (load_side(runs[k]).records for k in ("a", "b", "slow"))
    assert a and b and slow
    noise, real = bootstrap_deltas(a, b, resamples=100), bootstrap_deltas(a, slow, resamples=100)
    assert not significant(noise["tpot_s.p50"]) and significant(real["tpot_s.p50"])
    assert not significant(noise["ttft_s.p99"]) and significant(real["tpot_s.mean"])
