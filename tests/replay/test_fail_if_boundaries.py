"""`slogate compare --fail-if` at its boundary, on two real virtual-time replays of the same trace priced
$3 and $1.8 an hour: a change that equals its bound breaks `<=`/`>=` and holds for `<`/`>`, in every
bound mode (3 → 1.8 is −40 % although (1.8 − 3) / 3 is −0.39999999999999997 in floats, which let
`<=-40%` hold); an unsigned percentage is refused instead of read as a relative change; '!' on a stat
the bootstrap gives no interval (max) is refused instead of always breaking with "no per-request
records"; a bound the baseline has no value for says so (it blamed the candidate side)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate.cli import main as slogate
from tests.replay.conftest import AZURE


def _replay(out: Path, *extra: str) -> str:
    assert slogate(["replay", str(AZURE), "--window", "0:30", "--target", "sim:h100-sxm/llama-3-8b", "--virtual",
                    "--slo", "ttft=0.5,tpot=50ms", "--quiet", "--out", str(out), *extra]) == 0
    return str(out)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("bounds")
    return _replay(d / "base", "--cost-per-hour", "3"), _replay(d / "cand", "--cost-per-hour", "1.8")


def _check(sides: tuple[str, str], expr: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        status = slogate(["compare", *sides, "--fail-if", expr])
    except SystemExit as exc:  # a usage error
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize(("expr", "status"), [
    ("cost_per_hour_usd<=-40%", 1), ("cost_per_hour_usd<-40%", 0),
    ("cost_per_hour_usd>=-40%", 1), ("cost_per_hour_usd>-40%", 0),
    ("cost_per_hour_usd<=-1.2", 1), ("cost_per_hour_usd<-1.2", 0),
    ("cost_per_hour_usd<=1.8", 1), ("cost_per_hour_usd<1.8", 0),
    ("requests>=+0%", 1), ("requests>+0%", 0),
])
def test_a_change_equal_to_its_bound(sides: tuple[str, str], expr: str, status: int,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    got, out = _check(sides, expr, capsys)
    assert got == status, out
    if status:
        assert "broken" in out and ("-40.00%" in out or "-1.2" in out or "is 1.8" in out or "+0.00%" in out)


def test_an_unsigned_percentage_is_refused(sides: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _check(sides, "slo_attainment<95%", capsys)
    assert status == 2
    assert "'slo_attainment<95%'" in out and "'slo_attainment<0.95'" in out and "'slo_attainment<-95%'" in out
    assert len(out.strip().splitlines()) == 1


def test_significance_on_a_stat_without_an_interval_is_refused(sides: tuple[str, str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _check(sides, "ttft_s.max>+10%!", capsys)
    assert status == 2 and "'max'" in out and "p99_9" in out and "no per-request records" not in out
    assert _check(sides, "ttft_s.p99_9>+1000%!", capsys)[0] == 0  # a percentile still works


def test_a_baseline_without_the_value_is_named(tmp_path: Path, sides: tuple[str, str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    one_token = tmp_path / "one_token"  # 1-token answers: no TPOT
    assert slogate(["replay", "--synthetic", "poisson:rate=5", "--max-requests", "5", "--output-tokens", "fixed:1",
                    "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--quiet", "--out", str(one_token)]) == 0
    capsys.readouterr()
    assert slogate(["compare", str(one_token), sides[0], "--fail-if", "tpot_s.p99>+10%"]) == 1
    out = capsys.readouterr().out
    assert "base: the baseline one_token has no tpot_s.p99 to check the change 'tpot_s.p99>+10%' against" in out
    assert slogate(["compare", sides[0], str(one_token), "--fail-if", "tpot_s.p99>+10%"]) == 1
    assert "one_token: tpot_s.p99 has no value to check" in capsys.readouterr().out
