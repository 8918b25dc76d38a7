"""`slogate compare` says when the sides differ by definition rather than by performance: judged under
different SLOs (attainment and goodput then differ with identical latencies), or replays of different
traces. It used to show −70 % goodput between two identical runs with different --slo, and nothing more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate

SAMPLES = Path(__file__).resolve().parents[2] / "traces" / "samples"


def _run(out: Path, trace: str, *slo: str) -> str:
    assert slogate(["replay", str(SAMPLES / trace), "--target", "sim:h100-sxm/llama-3-8b", "--virtual",
                    "--max-requests", "30", "--out", str(out), "--quiet", *slo]) == 0
    return str(out)


def test_different_slos_and_traces_are_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loose = _run(tmp_path / "loose", "azure_conv_10min.csv", "--slo", "ttft=0.5,tpot=50ms")
    strict = _run(tmp_path / "strict", "azure_conv_10min.csv", "--slo", "ttft=0.05,tpot=10ms")
    again = _run(tmp_path / "again", "azure_conv_10min.csv", "--slo", "ttft=0.5,tpot=50ms")
    other = _run(tmp_path / "other", "azure_code_10min.csv", "--slo", "ttft=0.5,tpot=50ms")
    capsys.readouterr()

    assert slogate(["compare", loose, strict]) == 0
    out = capsys.readouterr().out
    assert "WARNING: the sides were judged under different SLOs" in out and "different traces" not in out
    assert slogate(["compare", loose, other]) == 0
    out = capsys.readouterr().out
    assert "WARNING: the runs replayed different traces" in out and "different SLOs" not in out
    assert slogate(["compare", loose, again]) == 0
    assert "WARNING" not in capsys.readouterr().out
    assert slogate(["compare", loose, strict, "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert len(warnings) == 1 and "different SLOs" in warnings[0]


def test_a_side_without_chunk_times_is_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A capture made without --trace-chunk-times spreads each request's tokens evenly over TTFT..E2E for
    in-window throughput; the demo's "production" column read 10 % above the same requests replayed (which
    carry every chunk time) in an overload."""
    import msgspec

    from slogate.traces import formats
    from slogate.traces.reader import read_trace

    run = _run(tmp_path / "run", "azure_conv_10min.csv", "--slo", "ttft=0.5,tpot=50ms")
    trace = read_trace(Path(run) / "requests.jsonl.zst")
    assert all(r.chunk_times for r in trace.records)
    bare = tmp_path / "cap.jsonl.zst"
    formats.save([msgspec.structs.replace(r, chunk_times=None) for r in trace.records], bare, "slogate",
                 header=trace.header)
    capsys.readouterr()
    assert slogate(["compare", str(bare), run]) == 0
    out = capsys.readouterr().out
    assert "WARNING: cap: records without chunk times" in out
    assert slogate(["compare", str(Path(run) / "requests.jsonl.zst"), run]) == 0
    assert "without chunk times" not in capsys.readouterr().out
