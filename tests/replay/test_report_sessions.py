"""The report's sessions block: a session-timed replay gets the sessions table, the session timeline
and the TTFT vs context length figure; a run without sessions gets none of it."""

from __future__ import annotations

import itertools
import re

import pytest

from slogate.replay.cli.replay import main as replay_main
from slogate.replay.outputs.records import read
from slogate.replay.report import write_report
from slogate.replay.report_sessions import context_points, timelines
from tests.replay.test_sessions import write_sessions

TARGET = "sim:h100-sxm/llama-3-8b"


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_report_draws_sessions_and_ttft_vs_context(tmp_path) -> None:
    paths = [str(p) for p in write_sessions(tmp_path)]
    assert replay_main([*paths, "--target", TARGET, "--virtual", "--endpoint", "completions", "--quiet",
                        "--out", str(tmp_path / "run")]) == 0
    assert replay_main(["--synthetic", "poisson:rate=5", "--duration", "2", "--seed", "1", "--target", TARGET,
                        "--virtual", "--quiet", "--out", str(tmp_path / "plain")]) == 0
    _, records = read(tmp_path / "run")
    lines = timelines(records)
    assert [s.session for s in lines] == ["a", "a.1", "b", "c"]  # the subagent right under its parent
    assert [len(s.turns) for s in lines] == [3, 2, 3, 2]
    assert all(a < e <= b for s in lines for (a, e, _), (b, _, _) in itertools.pairwise(s.turns)), "turns overlap"
    pts = context_points(records)
    assert len(pts) == 10 and sorted({p[0] for p in pts}) == [64, 96, 128]  # context grows by turn

    page = write_report([tmp_path / "run", tmp_path / "plain"], tmp_path / "report.html").read_text()
    block = page[page.index('<div id="sessions">'):]
    block = block[:block.index("<details><summary>all summary metrics")]
    row = re.search(r"<tr><td>run</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td>", block)
    assert row and row.groups() == ("4", "1", "10")
    assert "plain" not in block  # no sessions: no row, no figure
    assert block.count('<img src="data:image/png;base64,') == 1 and "TTFT p50 by turn" in block
    assert page.count('<div id="sessions">') == 1
