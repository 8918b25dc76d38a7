"""The report's change intervals (the `*`/`~` marks, the differences table and conclusion) are
`slogate compare`'s, to the digit, as replay/README.md promises ("same functions, same numbers"): the
report resampled 200 times where compare resamples 400, so its intervals (and a mark near the edge)
differed: p99 TTFT −108.2 … −81.4 % in the report, −107.1 … −80.2 % from compare on the same repeats.
Real virtual-time replays on the sim, with run-to-run noise (`replay --repeat 2`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay import report
from tests.replay.conftest import AZURE


def _repeats(out: Path, gpu: str) -> Path:
    assert slogate(["replay", str(AZURE), "--window", "0:30", "--target", f"sim:{gpu}/llama-3-8b?jitter=0.05",
                    "--virtual", "--slo", "ttft=0.5,tpot=50ms", "--repeat", "2", "--quiet", "--out", str(out)]) == 0
    return out


def test_report_intervals_are_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _repeats(tmp_path / "a", "a100-80g"), _repeats(tmp_path / "b", "h100-sxm")
    capsys.readouterr()
    assert slogate(["compare", "--repeat", "2", str(a / "run-1"), str(a / "run-2"), str(b / "run-1"),
                    str(b / "run-2"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["metrics"]
    cis = report.collect([a, b]).cis[0]
    assert cis is not None
    for metric in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p99", "e2e_s.p99", "goodput_rps"):
        assert list(cis[metric]) == rows[metric]["ci"][0], metric
