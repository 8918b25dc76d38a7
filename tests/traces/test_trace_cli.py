"""`slogate trace` through the real dispatcher in a subprocess: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

from slogate.traces import samples

_RUN = "import sys; from slogate.cli import main; sys.exit(main(sys.argv[1:]))"


def slogate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _RUN, "trace", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slogate trace: error:"), proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_stats_json_and_text() -> None:
    proc = slogate("stats", samples.path(samples.MOONCAKE_CONVERSATION), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {"requests", "duration_s", "mean_rps", "interarrival_cv", "input_tokens", "output_tokens",
            "prefix_reuse"} <= set(data)
    assert data["requests"] == 1750 and set(data["input_tokens"]) == {"mean", "p50", "p99"}
    text = slogate("stats", samples.path(samples.AZURE_CONV)).stdout
    assert "requests         2,867" in text and "prefix_reuse     n/a" in text


def test_convert_validate_head(tmp_path) -> None:
    out = tmp_path / "conv.jsonl.zst"
    proc = slogate("convert", samples.path(samples.AZURE_CONV), out)
    assert proc.returncode == 0 and "2,867 records" in proc.stdout
    _one_line_error(slogate("convert", samples.path(samples.AZURE_CONV), out), "exists", "--force")
    back = tmp_path / "back.csv"
    assert slogate("convert", out, back).returncode == 0
    assert back.read_bytes() == samples.path(samples.AZURE_CONV).read_bytes()
    proc = slogate("validate", out)
    assert proc.returncode == 0 and ": ok (slogate, 2,867 records" in proc.stdout
    lines = slogate("head", out, "-n", "2").stdout.splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["kind"] == "header" and json.loads(lines[1])["t"] == 0.0

    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    proc = slogate("validate", out)
    assert proc.returncode == 1 and "invalid" in proc.stdout and "at byte" in proc.stdout
    _one_line_error(slogate("stats", out), str(out), "at byte")


def test_user_errors_are_one_line() -> None:
    _one_line_error(slogate("stats", "/no/such/trace.csv"), "no such trace file: /no/such/trace.csv")
    _one_line_error(slogate("stats", samples.path(samples.AZURE_CONV), "--from", "xlsx"), "'xlsx'", "azure")
    _one_line_error(slogate("stats", samples.path(samples.BURSTGPT).with_name("README.md")), "--from")


def test_help_has_examples() -> None:
    proc = slogate("--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout and "slogate trace convert" in proc.stdout
