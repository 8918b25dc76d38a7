"""A prompt the server rejects (longer than the context: 400, no usage) counts no input tokens, in a
virtual run as over HTTP. The virtual record kept the planned length, so the same trace's
total_tokens_per_s read 46,073 tok/s in virtual time where its successful requests processed ~5,000."""

from __future__ import annotations

import json
from pathlib import Path

from slogate.cli import main as slogate
from slogate.traces.reader import read_trace
from tests.simserver import start_sim

LINES = [  # Mooncake: ms, tokens; the second prompt does not fit llama-3-8b's 8192-token context
    '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}',
    '{"timestamp": 100, "input_length": 9000, "output_length": 5, "hash_ids": [2]}',
    '{"timestamp": 200, "input_length": 200, "output_length": 5, "hash_ids": [3]}',
]


def test_a_rejected_prompt_counts_no_input_tokens_virtual_and_over_http(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(LINES) + "\n")
    common = [str(trace), "--max-requests", "3", "--quiet", "--block-size", "512"]
    assert slogate(["replay", *common, "--target", "sim:h100-sxm/llama-3-8b", "--virtual",
                    "--out", str(tmp_path / "virtual")]) == 0
    with start_sim(timing="constant", ttft_ms=2, itl_ms=1) as sim:
        assert slogate(["replay", *common, "--target", sim.url, "--out", str(tmp_path / "http")]) == 0
    for run in ("virtual", "http"):
        records = sorted(read_trace(tmp_path / run / "requests.jsonl.zst").records, key=lambda r: r.t)
        assert [r.status for r in records] == [200, 400, 200], run
        assert records[1].input_tokens is None and all(r.input_tokens for r in (records[0], records[2])), run
    totals = {run: json.loads((tmp_path / run / "results.json").read_text())["summary"] for run in ("virtual", "http")}
    assert totals["virtual"]["failed"] == totals["http"]["failed"] == 1
