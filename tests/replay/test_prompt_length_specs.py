"""Synthetic length specs (`--input-tokens`, `--output-tokens`) are lengths of at least one token: a bare
`0` was run as 0-token prompts and outputs with exit status 0, a lognormal with median ≤ 0 or a huge
sigma was a Python traceback. Bad specs are one line on stderr and exit status 2; a wide lognormal is
clamped to [1, max]. Against the sim in virtual time (no request is sent for a refused spec)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import REPO

SLOGATE = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())"]
SIM = "sim:h100-sxm/llama-3-8b"


def replay(out: Path, *, inputs: str, outputs: str = "fixed:2") -> subprocess.CompletedProcess:
    return subprocess.run([*SLOGATE, "replay", "--synthetic", "constant:rate=50", "--max-requests", "4",
                           "--input-tokens", inputs, "--output-tokens", outputs, "--target", SIM, "--virtual",
                           "--quiet", "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize(("inputs", "outputs"), [
    ("0", "fixed:2"),  # a bare number is fixed:N and must be ≥ 1, as fixed:0 already was
    ("fixed:8", "0"),
    ("lognormal:median=0", "fixed:2"),
    ("lognormal:mean=-3,sigma=0.5", "fixed:2"),
    ("lognormal:median=100,sigma=-1", "fixed:2"),
    ("lognormal:median=100,max=0", "fixed:2"),
])
def test_bad_length_spec_is_one_line_and_status_2(tmp_path: Path, inputs: str, outputs: str) -> None:
    p = replay(tmp_path / "run", inputs=inputs, outputs=outputs)
    assert p.returncode == 2, (p.returncode, p.stderr[-500:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "length" in lines[0], p.stderr
    assert not (tmp_path / "run" / "results.json").exists()


def test_wide_lognormal_is_clamped_not_an_overflow(tmp_path: Path) -> None:
    p = replay(tmp_path / "run", inputs="lognormal:median=50,sigma=1e6,max=4000")
    assert p.returncode == 0, p.stderr[-500:]
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert summary["requests"] == 4 and summary["failed"] == 0
