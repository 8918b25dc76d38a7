"""`slogate sim` argument handling: help, and one-line errors that name the bad value (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slogate.replay.sim.options import configure
from slogate.traces.usage import UsageError


def slogate(*args: str) -> subprocess.CompletedProcess[str]:
    # as the `slogate` console script does it (python -m traces.cli would define a second UsageError class)
    code = "import sys; from slogate.cli import main; sys.exit(main())"
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
    (["--timing", "roofline", "--linear", "1,0,0,0"], "but --timing is roofline"),
    (["--host-step-ms", "-2"], "host time per step must be ≥ 0"),
    (["--port", "70000"], "--port 70000 is outside 1–65535; pass a port in that range"),
    (["--port", "65535", "--replicas", "2"], "--port 65535 with 2 replicas (ports 65535–65536) is outside"),
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
    config, _, _ = configure(["--tp", "4", "--host-step-ms", "6", "--host-seq-us", "60"])
    assert (config.host_step_ms, config.host_seq_us) == (6.0, 60.0)
    with pytest.raises(UsageError, match="cannot use --config"):
        configure(["--config", str(tmp_path / "missing.toml")])


def _steps_csv(path, a=20.0, b=0.05, c=0.2, d=0.0005) -> None:
    """Steps of a known linear engine: step ms = a + b·new_tokens + c·seqs + d·kv_tokens."""
    rows = ["new_tokens,seqs,kv_tokens,step_ms"]
    for new, seqs, kv in ((1, 1, 100), (512, 1, 512), (64, 64, 20000), (300, 8, 4000), (2048, 4, 9000),
                          (128, 128, 60000), (16, 16, 1000)):
        rows.append(f"{new},{seqs},{kv},{a + b * new + c * seqs + d * kv}")
    path.write_text("\n".join(rows) + "\n")


def test_linear_fit_from_measured_steps(tmp_path):
    steps = tmp_path / "steps.csv"
    _steps_csv(steps)
    config, _, _ = configure(["--linear-fit", str(steps)])
    c = config.linear
    assert config.timing == "linear" and c is not None
    assert (c.a_ms, c.b_ms, c.c_ms, c.d_ms) == pytest.approx((20.0, 0.05, 0.2, 0.0005), rel=1e-6)


@pytest.mark.parametrize(("content", "needle"), [
    ("a,b\n1,2\n", "expected a CSV header with new_tokens,seqs,kv_tokens,step_ms"),
    ("new_tokens,seqs,kv_tokens,step_ms\n1,1,10,5\n2,1,x,6\n", "line 3"),
    ("new_tokens,seqs,kv_tokens,step_ms\n1,1,10,5\n", "at least 4 samples, got 1"),
])
def test_linear_fit_errors_name_the_file_and_line(tmp_path, content, needle):
    steps = tmp_path / "steps.csv"
    steps.write_text(content)
    p = slogate("--port", "1", "--linear-fit", str(steps))
    assert p.returncode == 2 and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


async def test_server_runs_the_fitted_model(tmp_path, sim_server):
    """The fitted model drives the real-clock server: one request alone decodes at ≈ a + b + c + d·kv."""
    import itertools
    import statistics
    import time

    import aiohttp

    steps = tmp_path / "steps.csv"
    _steps_csv(steps)
    sim = sim_server(timing="linear", extra_args=["--linear-fit", str(steps), "--jitter", "0"])
    body = {"model": "llama-3-8b", "prompt": "a b c d", "max_tokens": 40, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as http, http.post(sim.url + "/v1/completions", json=body) as r:
        times = []
        async for chunk in r.content.iter_any():
            times += [time.perf_counter()] * chunk.count(b'"text":"')
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 40
    assert statistics.median(gaps) == pytest.approx(0.0203, rel=0.25)  # 20 + 0.05 + 0.2 + 0.0005·~25 ms
