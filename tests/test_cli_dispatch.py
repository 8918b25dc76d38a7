"""The `slogate` dispatcher (slogate/cli.py) as a shell user meets it: a reader that leaves the pipe early
(`slogate compare … | head`) ends the command quietly with 141, as `cat`
ends, never a BrokenPipeError traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from slogate.cli import main as slogate


def _run_into_closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """stdout is a pipe whose reader is already gone: every write fails with EPIPE (Python ignores SIGPIPE)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "slogate", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              cwd=cwd, timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    finally:
        os.close(w)


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    for gpu in ("h100-sxm", "a100-80g"):
        assert slogate(["replay", "--target", f"sim:{gpu}/llama-3-8b", "--synthetic", "poisson:rate=5",
                        "--max-requests", "20", "--input-tokens", "fixed:50", "--output-tokens", "fixed:10",
                        "--virtual", "--quiet", "--out", str(tmp_path / gpu)]) == 0
    proc = _run_into_closed_pipe(["compare", "h100-sxm", "a100-80g"], tmp_path)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
