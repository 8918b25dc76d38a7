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


# -- cut files: read up to the cut ------------------------------------------------------------------


def _replay_run(out) -> list:
    """A real virtual replay: its requests.jsonl.zst holds 200 records in one zstd frame (after the header's)."""
    from slogate.cli import main
    from slogate.traces.reader import read_trace

    assert main(["replay", str(samples.path(samples.AZURE_CONV)), "--target", "sim:h100-sxm/llama-3-8b", "--virtual",
                 "--max-requests", "200", "--out", str(out), "--quiet"]) == 0
    records = read_trace(out / "requests.jsonl.zst").records
    assert len(records) == 200
    return records


def test_cut_replay_output_keeps_its_records(tmp_path) -> None:
    """A replay's output cut by one byte or in the middle (a crash, a copy mid-write) keeps every whole record
    of the cut frame; validate reads it as a cut file (ok, the cut said), not as an empty one."""
    from slogate.traces.reader import read_trace

    records = _replay_run(tmp_path / "run")
    data = (tmp_path / "run" / "requests.jsonl.zst").read_bytes()
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(data[:-1])  # only the checksum is cut
    assert json.loads(slogate("stats", cut, "--json").stdout)["requests"] == 200
    proc = slogate("validate", cut)
    assert proc.returncode == 0, proc
    assert ": ok (slogate, 200 records" in proc.stdout and "cut short: 200 records recovered" in proc.stdout, proc.stdout
    cut.write_bytes(data[: len(data) // 2])
    kept = read_trace(cut).records
    assert 80 <= len(kept) < 200 and kept == records[: len(kept)]
    proc = slogate("validate", cut)
    assert proc.returncode == 0 and f"{len(kept)} records recovered from a cut last frame" in proc.stdout, proc.stdout
    assert json.loads(slogate("stats", cut, "--json").stdout)["requests"] == len(kept)


def test_cut_gateway_capture_reads_as_before_plus_the_cut_frame(tmp_path) -> None:
    """A gateway capture (a frame per flush) cut in its last frame: the complete frames, then the whole
    records of the cut one; validate says the same as for any cut file."""
    from slogate.traces.record import RequestRecord, TraceHeader
    from slogate.traces.writer import TraceWriter, WriterConfig

    writer = TraceWriter(WriterConfig(directory=str(tmp_path / "cap"), flush_interval_s=3600), TraceHeader()).start()
    for frame in range(3):
        for i in range(100):
            writer.submit(RequestRecord(t=frame * 100 + i, input_tokens=frame * 100 + i, output_tokens=7))
        assert writer.flush()
    writer.close()
    path, = writer.paths
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    proc = slogate("validate", path)
    assert proc.returncode == 0 and "ok (slogate, 300 records" in proc.stdout, proc.stdout
    assert "cut short: 100 records recovered from a cut last frame, 3 bytes skipped" in proc.stdout, proc.stdout


# -- implausible timestamps ------------------------------------------------------------------------------


def _mooncake(path, *timestamps_ms: str):
    path.write_text("".join(f'{{"timestamp": {ts}, "input_length": 100, "output_length": 10, "hash_ids": [{i}]}}\n'
                            for i, ts in enumerate(timestamps_ms)))
    return path


def test_validate_fails_an_implausible_span_naming_the_request(tmp_path) -> None:
    """An epoch-ms timestamp among offsets (a common mistake) or 1e300: invalid, one line naming the request
    and its value; stats prints the span in a few characters and points at validate. A day is fine."""
    epoch = _mooncake(tmp_path / "epoch.jsonl", "0", "5000", "1700000000000")
    proc = slogate("validate", epoch)
    assert proc.returncode == 1 and "epoch.jsonl: invalid (mooncake, 3 records)" in proc.stdout, proc.stdout
    problem, = proc.stdout.splitlines()[1:]
    assert problem.startswith("  record 3: t=1.7e+09 s arrives 53.9 years after the first arrival"), problem
    assert "wrong unit" in problem
    absurd = _mooncake(tmp_path / "absurd.jsonl", "0", "1e300")
    proc = slogate("validate", absurd)
    assert proc.returncode == 1 and "record 2: t=1e+297 s" in proc.stdout, proc.stdout
    row, = [ln for ln in slogate("stats", absurd).stdout.splitlines() if ln.startswith("duration_s")]
    assert "1.000e+297" in row and "wrong unit" in row and len(row) < 120, row
    day = _mooncake(tmp_path / "day.jsonl", "0", str(86_400_000))
    proc = slogate("validate", day)
    assert proc.returncode == 0 and "day.jsonl: ok (mooncake, 2 records)" in proc.stdout, proc.stdout
    assert "wrong unit" not in slogate("stats", day).stdout


def test_converting_an_empty_trace_prints_no_peer_commands(tmp_path) -> None:
    """The commands for AIPerf/guidellm carry the trace's lengths and rate; an empty trace has none (they
    were printed with made-up numbers: 512 prompt tokens, rate 1, --max-requests 0)."""
    src = tmp_path / "empty.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    proc = slogate("convert", src, tmp_path / "empty.jsonl", "--to", "mooncake")
    assert proc.returncode == 0, proc.stderr
    assert "wrote 0 records" in proc.stdout and "aiperf" not in proc.stdout and "guidellm" not in proc.stdout
