"""An output path that cannot be written is a one-line error (exit 2) before any work: a replay must not
send its whole load and only then fail to write its results (replay.cli.args.output_dir)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slogate.cli import main as slogate

TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "samples" / "azure_conv_10min.csv")
CLOSED = "http://127.0.0.1:9"  # nothing listens: a check that came after the target's would name it


def bad_outs(tmp_path: Path) -> list[tuple[str, str]]:
    (tmp_path / "file.csv").write_text("x\n")
    return [(str(tmp_path / "file.csv" / "sub"), "is a file, not a directory"),
            (str(tmp_path / "file.csv"), "exists and is not a directory"),
            ("/proc/slogate-out", "cannot write in /proc")]


@pytest.mark.parametrize("command", [
    ["replay", TRACE, "--target", CLOSED, "--max-requests", "5"],
    ["replay", TRACE, "--target", "sim:h100-sxm/llama-3-8b", "--virtual", "--max-requests", "5"],
    ["sweep", TRACE, "--target", CLOSED, "--speeds", "1", "--max-requests", "5"],
    ["plan", TRACE, "--slo", "ttft=2", "--candidates", "h100-sxm/llama-3-8b", "--max-requests", "5"],
], ids=["replay", "replay-virtual", "sweep", "plan"])
def test_an_unwritable_out_is_a_one_line_error_first(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      command: list[str]) -> None:
    for out, fragment in bad_outs(tmp_path):
        assert slogate([*command, "--out", out]) == 2, out
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.csv"]  # nothing left behind (no probe dir)


def test_a_new_nested_out_is_created(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    run = subprocess.run([sys.executable, "-m", "slogate", "replay", TRACE, "--target", "sim:h100-sxm/llama-3-8b",
                          "--virtual", "--max-requests", "5", "--out", str(out), "--quiet"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (out / "results.json").exists()
