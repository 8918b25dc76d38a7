"""`slogate compare --repeat N`: each side is N repeated runs; values are the repeats' means, each
metric's run-to-run spread is reported and every change's CI covers it. Real virtual-time replays on the
sim (step-time jitter 5 %, a different seed per repeat), plus a case built from records where the
per-request bootstrap alone would call a run-level shift real and the repeats say it is noise."""

from __future__ import annotations

import json

import pytest

from slogate.cli import main as slogate
from slogate.replay.compare import Side, intervals
from slogate.replay.repeats import combine, mean_summary, widen
from slogate.replay.results import Environment, Results
from slogate.replay.significance import repeat_interval, significant, spread, t975
from slogate.traces.record import RequestRecord
from slogate.traces.summary import summarize
from tests.replay.test_compare_runs import make_trace, replay
from tests.replay.test_compare_significance import BASE, SLOW


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    d = tmp_path_factory.mktemp("repeat")
    trace = make_trace(d / "t.jsonl.zst", rate=40, seconds=4)
    out: dict[str, list[str]] = {"a": [], "b": [], "slow": []}
    for side, target, seeds in (("a", BASE, (1, 2, 3)), ("b", BASE, (4, 5, 6)), ("slow", SLOW, (7, 8, 9))):
        for seed in seeds:
            out[side].append(str(replay(trace, d / f"{side}{seed}", target=target.format(seed=seed))))
    return out


def compare_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    status = slogate(["compare", *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_repeats_of_one_setup_differ_only_by_noise(runs: dict[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    status, data = compare_json(capsys, "--repeat", "3", *runs["a"], *runs["b"])
    assert status == 0
    assert [s["name"] for s in data["sides"]] == ["a1", "b4"]
    assert data["repeats"]["n"] == 3 and data["repeats"]["sources"] == [runs["a"], runs["b"]]
    rows = data["metrics"]
    for metric in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "e2e_s.p99", "output_tokens_per_s"):
        (low, high), = rows[metric]["ci"]
        assert low <= 0 <= high, (metric, low, high)
        assert rows[metric]["significant"] == [False], metric
    # the spread is measured: the seeds change TPOT a little between repeats, never by much
    tpot = data["repeats"]["noise"]["tpot_s.p50"]
    assert all(0 < s["cv"] < 0.05 and s["n"] == 3 and s["low"] < s["high"] for s in tpot)
    # the side's value is the mean of its repeats
    assert rows["tpot_s.p50"]["values"][0] == pytest.approx(tpot[0]["mean"])


def test_slower_setup_is_significant_beyond_the_repeat_noise(runs: dict[str, list[str]],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    status, data = compare_json(capsys, "--repeat", "3", *runs["a"], *runs["slow"], "--fail-if", "tpot_s.p50>+10%!")
    assert status == 1 and not data["checks"]["passed"]
    row = data["metrics"]["tpot_s.p50"]
    assert row["relative"][0] == pytest.approx(0.3, abs=0.06) and row["significant"] == [True]
    # throughput metrics (no per-request bootstrap) get a CI from the repeats alone, so '!' works on them
    assert data["metrics"]["output_tokens_per_s"]["ci"][0] is not None
    status, data = compare_json(capsys, "--repeat", "3", *runs["a"], *runs["b"], "--fail-if", "goodput_rps<-0%!",
                                "--fail-if", "goodput_rps>+0%!")
    assert status == 0 and data["checks"]["passed"]  # a noise-level goodput change breaks neither '!' bound
    assert data["metrics"]["goodput_rps"]["significant"] == [False] and data["metrics"]["goodput_rps"]["relative"][0] > 0
    assert slogate(["compare", "--repeat", "3", *runs["a"], *runs["b"], "--fail-if", "goodput_rps>+0%"]) == 1
    capsys.readouterr()


def test_plain_output_prints_the_noise(runs: dict[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["compare", "--repeat", "3", *runs["a"], *runs["slow"]]) == 0
    out = capsys.readouterr().out
    assert "run-to-run noise over 3 repeats per side" in out
    assert "tpot_s.p50" in out.split("run-to-run noise")[1] and "*" in out


def test_bad_repeat_is_one_line_exit_2(runs: dict[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["compare", "--repeat", "2", *runs["a"]]) == 2
    err = capsys.readouterr().err
    assert "bad --repeat 2" in err and len(err.strip().splitlines()) == 1
    assert slogate(["compare", "--repeat", "3", *runs["a"]]) == 2
    assert "at least two sides" in capsys.readouterr().err
    assert slogate(["compare", runs["a"][0], runs["b"][0], "--fail-if", "goodput_rps<-0%!"]) == 2
    assert "or --repeat N for any metric" in capsys.readouterr().err


def _side(name: str, ttft: float, n: int = 200) -> Side:
    recs = [RequestRecord(t=i * 0.05, ttft=ttft + (i % 5) * 1e-4, e2e=ttft + 0.1, output_tokens=10) for i in range(n)]
    return Side(name=name, source=name, kind="run", results=Results(environment=Environment(), summary=summarize(recs)),
                records=recs)


def test_run_level_shifts_are_noise_the_bootstrap_alone_misses() -> None:
    """Each repeat shifts every request by the same amount (a warm cache, a noisy neighbour): pooled,
    the per-request bootstrap sees a tight 5 ms change; the repeats show runs that differ by 20 ms."""
    a = combine([_side("a1", 0.100), _side("a2", 0.120)])
    b = combine([_side("b1", 0.105), _side("b2", 0.125)])
    boot = intervals([a.side, b.side], seed=0, resamples=100)
    assert significant(boot[0]["ttft_s.mean"])  # what compare said without --repeat
    wide = widen([a, b], boot)[0]
    assert not significant(wide["ttft_s.mean"])
    assert wide["ttft_s.mean"][0] <= boot[0]["ttft_s.mean"][0] and wide["ttft_s.mean"][1] >= boot[0]["ttft_s.mean"][1]
    assert a.side.results.summary.ttft_s.p50 == pytest.approx(0.110 + 2e-4)
    assert a.side.results.summary.requests == 200  # counts stay integers


def test_welch_interval_and_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706) and t975(10) == pytest.approx(2.228) and t975(100) == pytest.approx(1.984, abs=0.002)
    assert repeat_interval([1.0], [2.0, 2.1]) is None
    low, high = repeat_interval([1.0, 1.1, 0.9], [2.0, 2.1, 1.9])
    assert low < 1.0 < high and low > 0.7 and high < 1.3
    s = spread([1.0, 2.0, 3.0])
    assert s is not None and s.sd == pytest.approx(1.0) and s.cv == pytest.approx(0.5)
    assert mean_summary([summarize([RequestRecord(t=0, ttft=0.1, e2e=0.2, output_tokens=3)])]).output_tokens == 3


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_replay_repeat_runs_n_times_and_reports_the_spread(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`slogate replay --repeat 3` (real clock, the sim behind the same API): three runs in OUT/run-K and
    the spread of each metric over them in OUT/repeats.json, which `compare --repeat 3` reads as a side."""
    from tests.replay.test_compare_runs import replay_args

    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=1.5)
    out = tmp_path / "rep"
    args = replay_args(trace, target=BASE.format(seed=1), virtual=False)
    assert slogate(["replay", *args, "--out", str(out), "--quiet", "--repeat", "3"]) == 0
    printed = capsys.readouterr().out
    assert "run-to-run spread over 3 repeats" in printed and "ttft_s.p50" in printed
    runs = [json.loads((out / f"run-{k}" / "results.json").read_text())["summary"] for k in (1, 2, 3)]
    assert all(r["requests"] == 30 for r in runs)
    rep = json.loads((out / "repeats.json").read_text())
    assert rep["n"] == 3 and rep["runs"] == ["run-1", "run-2", "run-3"]
    p50 = [r["ttft_s"]["p50"] for r in runs]
    got = rep["spread"]["ttft_s.p50"]
    assert got["mean"] == pytest.approx(sum(p50) / 3) and got["low"] == min(p50) and got["high"] == max(p50)
    assert got["sd"] > 0  # real-clock runs differ: the spread is measured, not assumed
    sides = [str(out / f"run-{k}") for k in (1, 2, 3)]
    status, data = compare_json(capsys, "--repeat", "3", *sides, *sides)
    assert status == 0 and data["repeats"]["n"] == 3


def test_replay_repeat_one_line_errors(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.replay.test_compare_runs import replay_args

    trace = make_trace(tmp_path / "t.jsonl.zst", rate=20, seconds=1)
    assert slogate(["replay", *replay_args(trace), "--out", str(tmp_path / "x"), "--quiet", "--repeat", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeat 0" in err[0], err
