"""Zero, infinite, negative or NaN option values are one-line errors (exit 2), never silently ignored:
`--max-requests 0` used to replay the whole trace and `--speed 0` to replay at the trace's speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate.cli import main as slogate

TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "samples" / "azure_conv_10min.csv")


@pytest.mark.parametrize(("option", "fragment"), [
    (["--max-requests", "0"], "bad --max-requests 0: must be ≥ 1"),
    (["--speed", "0"], "bad speed 0.0: must be > 0 and finite"),
    (["--speed", "inf"], "bad speed inf: must be > 0 and finite"),
    (["--rate", "0"], "bad rate 0.0: must be > 0 and finite"),
    (["--sample", "0"], "bad sample fraction 0.0: must be in (0, 1]"),
    (["--concurrency", "0"], "bad --concurrency 0: must be 1 to 1,000,000"),
    (["--concurrency", "10000000"], "bad --concurrency 10000000: must be 1 to 1,000,000"),  # 1e30 ran forever
    (["--cost-per-hour", "-5"], "bad --cost-per-hour -5.0"),
    (["--cost-per-hour", "nan"], "bad --cost-per-hour nan"),
    (["--timeout", "0"], "bad --timeout 0: must be > 0"),
])
def test_a_meaningless_value_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 option: list[str], fragment: str) -> None:
    assert slogate(["replay", TRACE, "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--out",
                    str(tmp_path / "run"), "--quiet", *option]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_plan_refuses_max_requests_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert slogate(["plan", TRACE, "--slo", "ttft=2", "--candidates", "h100-sxm/llama-3-8b", "--max-requests", "0"]) == 2
    assert "bad --max-requests 0: must be ≥ 1" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "fragment"), [
    (["--max-requests", "30", "--warmup", "30"], "--warmup 30 covers all 30 requests: nothing is left to measure"),
    (["--max-requests", "50", "--warmup", "5000"], "--warmup 5000 covers all 50 requests"),
    (["--window", "9000:9100"], "the workload is empty after --window (the trace has 2867 requests)"),
])
def test_nothing_to_measure_is_an_error_that_names_why(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        option: list[str], fragment: str) -> None:
    """A warm-up that eats the whole workload used to give a run of 0 requests with real-looking zeros
    (attainment 0 %, 0 req/s) and a report that called it trustworthy."""
    assert slogate(["replay", TRACE, "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--out",
                    str(tmp_path / "run"), "--quiet", *option]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err


def test_an_unknown_format_names_the_flag_each_command_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.txt").write_text("garbage\n")
    for command in (["replay", str(tmp_path / "t.txt"), "--target", "sim:h100-sxm/llama-3-8b", "--virtual"],
                    ["trace", "stats", str(tmp_path / "t.txt")]):
        assert slogate(command) == 2
        err = capsys.readouterr().err
        assert "--format FMT (replay, plan) or --from FMT (trace)" in err and "parquet" not in err, err


def test_plan_needs_a_rate_and_warns_on_a_short_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One request has no rate to scale (the plan printed "capacity 0+"); thirty, sped up, are one burst,
    whose "capacity" of hundreds of req/s priced the good tokens far too cheaply."""
    one = tmp_path / "one.csv"
    one.write_text("\n".join(Path(TRACE).read_text().splitlines()[:2]) + "\n")
    args = ["--slo", "ttft=2,tpot=0.1", "--candidates", "h100-sxm/llama-3-8b", "--jobs", "1"]
    assert slogate(["plan", str(one), *args]) == 2
    assert "plan needs a rate to scale: at least two requests at different times" in capsys.readouterr().err
    assert slogate(["plan", TRACE, "--max-requests", "30", *args]) == 0
    assert "warning: only 30 requests" in capsys.readouterr().err
    assert slogate(["plan", TRACE, "--max-requests", "120", *args]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(("lines", "fragment"), [
    (['{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}',
      '{"timestamp": 1000, "input_length": -374, "output_length": 10, "hash_ids": [2]}'],
     "record 2: bad input_tokens=-374"),
    (['{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}',
      '{"timestamp": 1700000000000, "input_length": 100, "output_length": 10, "hash_ids": [2]}'],
     "record 2: t=1.7e+09 s arrives 53.9 years after the first arrival"),
])
def test_a_trace_validate_rejects_is_not_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  lines: list[str], fragment: str) -> None:
    """A negative token count used to be sent as 1 token with "drift 0 %"; an epoch-ms timestamp among
    offsets was a replay of 54 years. Replay and plan now refuse what `trace validate` calls invalid."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    for command in (["replay", str(trace), "--target", "sim:h100-sxm/llama-3-8b", "--virtual",
                     "--out", str(tmp_path / "run")],
                    ["plan", str(trace), "--slo", "ttft=2", "--candidates", "h100-sxm/llama-3-8b"]):
        assert slogate(command) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and "slogate trace validate lists every problem" in err and len(err.splitlines()) == 1
    assert slogate(["trace", "validate", str(trace)]) == 1
    assert fragment in capsys.readouterr().out


def test_validate_accepts_a_request_that_got_no_response() -> None:
    """A replay records a request that got no response (connect error) with status 0 and its error
    class; validate called such a replay output invalid ("bad status=0")."""
    from slogate.traces.record import RequestRecord
    from slogate.traces.validate import problems

    assert problems([RequestRecord(t=0.0, status=0, error="connect")]) == []
    assert problems([RequestRecord(t=0.0, status=0)]) == ["record 1: bad status=0"]
    assert problems([RequestRecord(t=0.0, status=0)], measured=False) == []  # what a replay schedules from


@pytest.mark.parametrize(("spec", "fragment"), [
    ("agentic:sessions=inf", "'sessions=inf': give a finite number"),  # was an OverflowError traceback
    ("agentic:turns=nan", "'turns=nan': give a finite number"),  # was a ValueError traceback
    ("poisson:rate=inf", "'rate=inf': give a finite number"),
    ("agentic:think=-1", "think (0 to 86400 s)"),  # was accepted (no think at all)
    ("agentic:think=1e12", "think (0 to 86400 s)"),  # a virtual duration_s of 2.1e12
    ("agentic:system=-100", "growth and system ≥ 0"),
])
def test_a_meaningless_synthetic_parameter_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               spec: str, fragment: str) -> None:
    assert slogate(["replay", "--synthetic", spec, "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--out",
                    str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
