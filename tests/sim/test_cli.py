"""`slogate sim` argument handling: help, and one-line errors that name the bad value (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replay.sim.cli import configure
from traces.cli import UsageError


def slogate(*args: str) -> subprocess.CompletedProcess[str]:
    # as the `slogate` console script does it (python -m traces.cli would define a second UsageError class)
    code = "import sys; from traces.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, "sim", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_examples_and_catalog():
    p = slogate("--help")
    assert p.returncode == 0
    assert "slogate sim --port 8000" in p.stdout and "H100-SXM" in p.stdout and "x-slogate-fault" in p.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--gpu", "tpu"], "unknown GPU 'tpu'"),
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--dtype", "fp3"], "unknown dtype 'fp3'"),
    (["--tp", "3"], "--tp 3"),
    (["--fault", "explode=1"], "bad --fault explode=1"),
    (["--gpu", "a10", "--model", "llama-3-70b"], "does not fit"),
    (["--timing", "linear"], "--timing linear needs coefficients"),
])
def test_usage_errors_exit_2(args, needle):
    p = slogate("--port", "1", *args)
    assert p.returncode == 2 and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_config_file_and_flags(tmp_path):
    f = tmp_path / "sim.toml"
    f.write_text('[sim]\ngpu = "a100-80g"\nmax_num_seqs = 64\n[server]\nmax_waiting = 10\n'
                 '[faults]\nerror_rate = 0.1\ndead = [[5.0, 6.0]]\n')
    config, opts, faults = configure(["--config", str(f), "--max-num-seqs", "32", "--fault", "slow_start=2"])
    assert config.gpu == "a100-80g" and config.max_num_seqs == 32 and opts.max_waiting == 10
    assert faults.error_rate == 0.1 and faults.dead == [(5.0, 6.0)] and faults.slow_start_s == 2
    with pytest.raises(UsageError, match="cannot use --config"):
        configure(["--config", str(tmp_path / "missing.toml")])
