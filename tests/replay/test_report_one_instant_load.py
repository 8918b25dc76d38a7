"""`slogate report` of a run whose arrivals have no span (one request): the Load table's busiest minute
read 1e+09 req/s (one request over a 1e-9 s floor) and the sweep's capacity conclusion sized 332,069,003
replicas for it. Now the peak, like the mean rate, is "–" and no replica count is claimed. Real
virtual-time replays on the sim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from tests.replay.conftest import AZURE


def test_one_request_has_no_peak_rate_and_sizes_no_replicas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--slo", "ttft=0.5,tpot=50ms"]
    assert slogate(["sweep", str(AZURE), "--window", "0:30", "--rates", "1,2", *common, "--out", str(tmp_path / "sw")]) == 0
    assert slogate(["replay", str(AZURE), "--max-requests", "1", *common, "--quiet", "--out", str(tmp_path / "one")]) == 0
    assert slogate(["report", str(tmp_path / "sw"), str(tmp_path / "one"), "-o", str(tmp_path / "r" / "report.html"),
                    "--no-plots"]) == 0
    capsys.readouterr()
    page = (tmp_path / "r" / "report.html").read_text()
    row = page.split('<td class="k">one</td>', 1)[1].split("</tr>", 1)[0]
    cells = [c.split("</td>", 1)[0] for c in row.split("<td>")[1:]]
    assert cells[0] == "1" and cells[2] == "–" and cells[4] == "–", cells  # requests, mean req/s, peak minute
    capacity = json.loads((tmp_path / "r" / "conclusions.json").read_text())["conclusions"][0]
    assert capacity["topic"] == "capacity" and "replicas" not in capacity["values"]
    assert "replicas serve" not in capacity["text"] and "1e+09" not in page
