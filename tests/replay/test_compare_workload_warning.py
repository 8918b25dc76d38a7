"""`slogate compare` warns when runs offered different workloads (another --duration, --rate, --speed,
--window, --max-requests…): their requests, rates and latencies differ by the load, not only by the setup.
Two replays of the same synthetic schedule, one cut at 2 s and one at 4 s, compared silently before (no
trace digest to differ). Real virtual-time replays on the sim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate


def _run(out: Path, duration: str) -> str:
    assert slogate(["replay", "--synthetic", "poisson:rate=5", "--duration", duration, "--output-tokens", "fixed:10",
                    "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--slo", "ttft=0.5", "--quiet",
                    "--out", str(out)]) == 0
    return str(out)


def test_runs_of_different_workloads_are_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    short, long, again = _run(tmp_path / "short", "2s"), _run(tmp_path / "long", "4s"), _run(tmp_path / "again", "2s")
    capsys.readouterr()
    assert slogate(["compare", short, long]) == 0
    out = capsys.readouterr().out
    assert ("WARNING: the runs offered different workloads (short: synthetic:poisson:rate=5 → duration=2s; "
            "long: synthetic:poisson:rate=5 → duration=4s)") in out
    assert slogate(["compare", short, again]) == 0
    assert "WARNING" not in capsys.readouterr().out
    assert slogate(["compare", short, long, "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert len(warnings) == 1 and "different workloads" in warnings[0]
