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
