"""`--force-output logit-bias:JSON` must map token ids to numbers: a key that is not a token id (`"abc"`)
was accepted and then failed every request on llama.cpp (HTTP 500 "invalid literal for int()"); `{}` was
reported as `output_forcing: logit_bias` while it forced nothing; `true` passed as a bias of 1. Refused up
front (one line, status 2, no results); a good map is still used as given. Against the sim over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import REPO

SLOGATE = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())"]
SIM = "sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=1&itl_ms=1"


def replay(out: Path, force: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SLOGATE, "replay", "--synthetic", "constant:rate=50", "--max-requests", "2",
                           "--input-tokens", "fixed:16", "--output-tokens", "fixed:3", "--target", SIM,
                           "--force-output", force, "--quiet", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize("bias", ['{"abc": -100}', "{}", '{"1": true}', '{"-1": -100}', '{"1.5": -100}'])
def test_bad_logit_bias_is_refused(tmp_path: Path, bias: str) -> None:
    p = replay(tmp_path / "run", "logit-bias:" + bias)
    assert p.returncode == 2, (p.returncode, p.stderr[-500:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "token ids" in lines[0], p.stderr
    assert not (tmp_path / "run" / "results.json").exists()


def test_good_logit_bias_is_used(tmp_path: Path) -> None:
    p = replay(tmp_path / "run", 'logit-bias:{"1": -100, " 106": -100}')
    assert p.returncode == 0, p.stderr[-500:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["environment"]["output_forcing"] == "logit_bias"
    assert results["summary"]["failed"] == 0
