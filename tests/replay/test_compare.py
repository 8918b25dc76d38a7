"""`slogate compare`: exit codes 0 / 1 (broken bound named) / 2 (bad expression, missing input) on
real replay results, deltas in --json, and a captured trace as the "production" side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.compare import CompareError, flatten, parse_bound
from slogate.replay.results import load
from slogate.traces.summary import RunSummary
from tests.replay.test_compare_runs import make_trace, replay, sim_target


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fast: H100; slower: A100 (steps ~1.5× longer, still under capacity, every request good);
    overloaded: L4 (capacity ~5 req/s < 20 req/s offered: queueing, SLO misses)."""
    d = tmp_path_factory.mktemp("compare")
    trace = make_trace(d / "trace.jsonl.zst", rate=20, seconds=4)
    return {
        "fast": replay(trace, d / "fast"),
        "fast2": replay(trace, d / "fast2"),
        "slower": replay(trace, d / "slower", target=sim_target(gpu="a100-80g")),
        "overloaded": replay(trace, d / "overloaded", target=sim_target(gpu="l4")),
    }


def compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = slogate(["compare", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_exit_0_when_every_bound_holds(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = compare(capsys, str(runs["fast"]), str(runs["fast2"]),
                               "--fail-if", "goodput_rps<-5%", "--fail-if", "ttft_s.p99>+10%")
    assert status == 0, out + err
    assert "OK: all 2 bound(s) hold" in out
    # plain text (not a TTY): one row per metric, baseline first
    assert "fast (baseline)" in out
    assert any(line.startswith("ttft_s.p99") for line in out.splitlines())


def test_exit_1_names_the_broken_bound(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = compare(capsys, str(runs["fast"]), str(runs["slower"]),
                             "--fail-if", "goodput_rps<-5%", "--fail-if", "ttft_s.p99>+10%")
    assert status == 1
    broken = [line for line in out.splitlines() if "' broken:" in line]
    assert len(broken) == 1, out  # goodput is unchanged (every request still meets the SLO)
    assert "slower" in broken[0] and "'ttft_s.p99>+10%'" in broken[0]
    a, b = load(runs["fast"]).summary.ttft_s.p99, load(runs["slower"]).summary.ttft_s.p99
    assert f"{(b - a) / a * 100:+.2f}%" in broken[0]  # the measured change is shown


def test_exit_1_on_absolute_and_value_bounds(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = compare(capsys, str(runs["fast"]), str(runs["slower"]), str(runs["overloaded"]),
                             "--fail-if", "slo_attainment<0.9", "--fail-if", "ttft_s.p50>+20ms")
    assert status == 1
    broken = [line.strip() for line in out.splitlines() if "' broken:" in line]
    assert any(b.startswith("overloaded:") and "slo_attainment<0.9" in b for b in broken), out
    assert any(b.startswith("overloaded:") and "ttft_s.p50>+20ms" in b for b in broken), out
    assert not any(b.startswith("slower:") for b in broken), out  # a few ms slower, attainment 1.0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--fail-if", "ttft_s.p99 ~ 10%"], "bad --fail-if 'ttft_s.p99 ~ 10%': expected METRIC OP BOUND"),
        (["--fail-if", "goodput<-5%"], "unknown metric 'goodput'"),
        (["--fail-if", "ttft_s.p42>1"], "unknown metric 'ttft_s.p42'; did you mean one of: ttft_s.count"),
    ],
)
def test_exit_2_on_bad_expression(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    status, _, err = compare(capsys, str(runs["fast"]), str(runs["slower"]), *args)
    assert status == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_exit_2_on_missing_or_unreadable_input(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = compare(capsys, str(runs["fast"]), str(tmp_path / "nope"))
    assert status == 2 and "nope: no such file or directory" in err
    junk = tmp_path / "junk.jsonl.zst"
    junk.write_bytes(b"not a trace")
    status, _, err = compare(capsys, str(runs["fast"]), str(junk))
    assert status == 2 and "junk.jsonl.zst" in err and len(err.strip().splitlines()) == 1
    status, _, err = compare(capsys, str(runs["fast"]))
    assert status == 2 and "at least two" in err


def test_json_deltas_match_the_results(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = compare(capsys, str(runs["fast"]), str(runs["slower"]), "--json", "--fail-if", "ttft_s.p99>+10%")
    assert status == 1
    data = json.loads(out)
    a, b = load(runs["fast"]).summary, load(runs["slower"]).summary
    row = data["metrics"]["ttft_s.p99"]
    assert row["values"] == [a.ttft_s.p99, b.ttft_s.p99]
    assert row["delta"][0] == pytest.approx(b.ttft_s.p99 - a.ttft_s.p99)
    assert row["relative"][0] == pytest.approx((b.ttft_s.p99 - a.ttft_s.p99) / a.ttft_s.p99)
    assert data["checks"]["passed"] is False
    assert data["checks"]["violations"][0]["bound"] == "ttft_s.p99>+10%"


def test_captured_trace_as_production_side(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A slogate trace with per-request timings (here the fast run's own records, as a gateway would
    capture them) is summarized over its span with the candidate run's SLO."""
    prod = runs["fast"] / "requests.jsonl.zst"
    status, out, _ = compare(capsys, str(prod), str(runs["fast"]), "--json",
                             "--fail-if", "ttft_s.p99>+1%", "--fail-if", "slo_attainment<-1%")
    assert status == 0, out
    data = json.loads(out)
    assert [s["kind"] for s in data["sides"]] == ["trace", "run"]
    run = load(runs["fast"]).summary
    assert data["metrics"]["requests"]["values"] == [run.requests, run.requests]
    assert data["metrics"]["ttft_s.p99"]["values"][0] == pytest.approx(run.ttft_s.p99)
    assert "goodput_by_slo.default.slo_attainment" in data["metrics"]  # the run's SLO applied to the trace


def test_bound_grammar() -> None:
    known = list(flatten(RunSummary()))
    assert parse_bound("goodput_rps<-5%", known).value == pytest.approx(-0.05)
    assert parse_bound("ttft_s.p99 >= +20ms", known).mode == "absolute"
    assert parse_bound("ttft_s.p99>+20ms", known).value == pytest.approx(0.02)
    assert parse_bound("slo_attainment<0.9", known).mode == "value"
    with pytest.raises(CompareError, match="OP one of"):
        parse_bound("ttft_s.p99=5", known)
