"""`--virtual` replays of traces with long idle gaps and with broken timestamps.

The engine telemetry (metrics.jsonl) does not grow with idle time: a run of more than MAX_RUN identical
samples is written as its first and last, so a 2-request trace spanning a day or 54 years (an epoch-ms
timestamp among offsets) takes a fraction of a second and a few lines. A non-finite timestamp is a
one-line usage error. Real replays through the CLI (subprocesses where a failure could be a hang or an
out-of-memory).
"""

from __future__ import annotations

import itertools
import json
import resource
import subprocess
import sys
from pathlib import Path

from slogate.cli import main as slogate
from slogate.replay.virtual_samples import MAX_RUN
from slogate.traces.reader import read_trace
from tests.replay.conftest import SAMPLES
from tests.servers import REPO

TARGET = "sim:h100-sxm/llama-3-8b?jitter=0"
SLOGATE = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())"]


def mooncake(path: Path, *timestamps_ms: float | str) -> Path:
    path.write_text("".join(f'{{"timestamp": {ts}, "input_length": 200, "output_length": 20, "hash_ids": [{i}]}}\n'
                            for i, ts in enumerate(timestamps_ms)))
    return path


def samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _limited() -> None:  # the child may not take more than 1.5 GB: the old sampler needed one bin per idle second
    resource.setrlimit(resource.RLIMIT_AS, (1500 << 20, 1500 << 20))


def run_limited(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLOGATE, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          preexec_fn=_limited)


def test_a_day_long_gap_costs_a_few_samples(tmp_path: Path) -> None:
    trace = mooncake(tmp_path / "day.jsonl", 0, 86_400_000)
    assert slogate(["replay", str(trace), "--target", TARGET, "--virtual", "--out", str(tmp_path / "run"),
                    "--quiet"]) == 0
    got = samples(tmp_path / "run")
    assert len(got) <= 5, [s["t"] for s in got]  # was 86,401 lines (16 MB)
    assert got[0]["t"] == 0.0 and got[-1]["t"] == 86400.0
    gap = [s for s in got if 1.0 < s["t"] < 86400.0] or [got[-1]]
    assert all(s["metrics"] == got[1]["metrics"] for s in gap)  # the idle state holds across the gap
    assert len(read_trace(tmp_path / "run" / "requests.jsonl.zst").records) == 2


def test_a_year_of_idle_time_replays_in_little_memory(tmp_path: Path) -> None:
    """300 days of virtual idle time (the longest span the loader accepts is a year): one sample per idle
    second was ~26M samples, a MemoryError under 1.5 GB; now instant."""
    span_ms = 300 * 86_400_000
    trace = mooncake(tmp_path / "year.jsonl", 0, span_ms)
    out = tmp_path / "run"
    proc = run_limited("replay", str(trace), "--target", TARGET, "--virtual", "--out", str(out), "--quiet")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(samples(out)) <= 5 and samples(out)[-1]["t"] == span_ms / 1000


def test_an_epoch_ms_timestamp_is_refused_before_any_work(tmp_path: Path) -> None:
    """An epoch time among offsets (54 years): the loader names the record (traces.validate)."""
    trace = mooncake(tmp_path / "epoch.jsonl", 0, 1_700_000_000_000)
    proc = run_limited("replay", str(trace), "--target", TARGET, "--virtual", "--out", str(tmp_path / "run"),
                       "--quiet")
    assert proc.returncode == 2 and "53.9 years after the first arrival" in proc.stderr, proc.stderr[-2000:]


def test_idle_stretches_longer_than_max_run_are_first_and_last(tmp_path: Path) -> None:
    """Bursts apart by a short gap (every second sampled) and by a long one (its first and last sample):
    filling the long gap back in with its held value gives the sample every second the dense form had."""
    burst = [i * 100 for i in range(20)]
    short_gap, long_gap = 2_000 + (MAX_RUN - 10) * 1000, 2_000 + 50 * MAX_RUN * 1000
    trace = mooncake(tmp_path / "t.jsonl", *burst, *(short_gap + t for t in burst),
                     *(short_gap + long_gap + t for t in burst))
    assert slogate(["replay", str(trace), "--target", TARGET, "--virtual", "--out", str(tmp_path / "run"),
                    "--quiet"]) == 0
    got = samples(tmp_path / "run")
    times = [s["t"] for s in got]
    jumps = [(a, b) for a, b in itertools.pairwise(got) if b["t"] - a["t"] != 1.0]
    assert len(jumps) == 1, [(a["t"], b["t"]) for a, b in jumps]  # only the long gap is compressed
    (a, b), = jumps
    assert a["metrics"] == b["metrics"] and b["t"] - a["t"] > 40 * MAX_RUN
    assert a["metrics"]["running"] == 0 and a["metrics"]["prefix_cache_queries_total"] == 40 * 200
    assert times[0] == 0.0 and len(got) < 3 * MAX_RUN  # dense: about 52 × MAX_RUN lines


def test_a_non_finite_timestamp_is_a_usage_error(tmp_path: Path) -> None:
    """BurstGPT timestamps are parsed as floats: "inf" hung a virtual replay, "nan" wrote a file no reader
    could read. Now one line naming the request and the value, exit 2, nothing written."""
    rows = (SAMPLES / "burstgpt_sample.csv").read_text().splitlines()[:3]
    for bad in ("inf", "nan"):
        trace = tmp_path / f"{bad}.csv"
        trace.write_text("\n".join([*rows, f"{bad},ChatGPT,100,10,110,Conversation log"]) + "\n")
        out = tmp_path / f"run-{bad}"
        proc = run_limited("replay", str(trace), "--target", TARGET, "--virtual", "--out", str(out), "--quiet",
                           timeout=30)
        assert proc.returncode == 2, proc.stderr[-2000:]
        line, = proc.stderr.strip().splitlines()
        assert f"record 3: bad t={bad}" in line and "slogate trace validate" in line, line  # the loader's check
        assert not out.exists()
