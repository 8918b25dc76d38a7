"""Only a results.json that slogate wrote is read as a run: `{}` or a plan.json used to read as a run of
0 requests (every Results field has a default), so a `compare --fail-if` gate passed on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from tests.simserver import start_sim

TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "samples" / "azure_conv_10min.csv")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert slogate(["replay", TRACE, "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--max-requests", "30",
                    "--out", str(out), "--quiet"]) == 0
    return out


def _bad(tmp_path: Path, run: Path, kind: str) -> Path:
    d = tmp_path / kind
    d.mkdir()
    if kind == "empty-object":
        doc: dict = {}
    elif kind == "plan-json":
        doc = {"schema_version": 1, "candidates": [], "command": ["slogate", "plan"]}
    else:  # a newer schema than this slogate reads
        doc = json.loads((run / "results.json").read_text()) | {"schema_version": 99}
    (d / "results.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize(("kind", "fragment"), [
    ("empty-object", "missing required field `schema_version`"),
    ("plan-json", "missing required field `summary`"),
    ("newer-schema", "schema_version 99 is newer than this slogate reads"),
])
def test_compare_and_report_refuse_what_is_not_a_run(tmp_path: Path, run: Path, capsys: pytest.CaptureFixture[str],
                                                      kind: str, fragment: str) -> None:
    bad = _bad(tmp_path, run, kind)
    for command in (["compare", str(run), str(bad), "--fail-if", "failed>+0"],
                    ["report", str(bad), "-o", str(tmp_path / "r.html")]):
        assert slogate(command) == 2, command
        err = capsys.readouterr().err.strip()
        assert "not a slogate results.json" in err and fragment in err and len(err.splitlines()) == 1, err
    assert slogate(["compare", str(run), str(run)]) == 0  # a real run still reads


def test_report_draws_a_capture_beside_a_run(tmp_path: Path, run: Path) -> None:
    """The README's "production vs candidate": `slogate report CAPTURE_DIR RUN` (a capture directory, or one
    trace file) shows the capture summarized as `compare` summarizes it. It used to ask for a results.json."""
    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / "seg-0.jsonl.zst").write_bytes((run / "requests.jsonl.zst").read_bytes())
    for production in (cap, cap / "seg-0.jsonl.zst"):
        html = tmp_path / "r.html"
        assert slogate(["report", str(production), str(run), "-o", str(html)]) == 0
        text = html.read_text()
        assert "a captured trace, summarized like a run over its offered window" in text and "run" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    assert slogate(["report", str(empty), "-o", str(tmp_path / "e.html")]) == 2


@pytest.mark.filterwarnings("error")  # matplotlib's "No artists with labels found" used to leak to stderr
def test_report_of_a_run_where_every_request_failed_draws_without_warnings(tmp_path: Path) -> None:
    from slogate.replay import report

    out = tmp_path / "failed"
    with start_sim(timing="constant", ttft_ms=2, itl_ms=1, extra_args=["--fault", "error_rate=1.0"]) as sim:
        slogate(["replay", TRACE, "--target", sim.url, "--max-requests", "10", "--speed", "50", "--out", str(out),
                 "--quiet"])
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["requests"] == summary["failed"] == 10
    assert report.plots_available()
    assert slogate(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
