"""`slogate trace convert --to mooncake` writes a file every peer's documented Mooncake schema accepts and
prints the exact commands that run it (AIPerf mooncake_trace, vLLM timed_trace, SGLang, guidellm)."""

from __future__ import annotations

import json

import jsonschema

from slogate.traces import samples
from tests.traces.test_trace_cli import slogate

# The fields AIPerf (`mooncake_trace`), vLLM `timed_trace` (its default --timed-trace-label-* names)
# and SGLang's mooncake loader read: timestamp in ms, token lengths, 512-token block ids.
MOONCAKE_SCHEMA = {
    "type": "object",
    "required": ["timestamp", "input_length", "output_length"],
    "properties": {
        "timestamp": {"type": "integer", "minimum": 0},
        "input_length": {"type": "integer", "minimum": 1},
        "output_length": {"type": "integer", "minimum": 1},
        "hash_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    },
}


def test_mooncake_export_matches_the_schema_and_prints_peer_commands(tmp_path) -> None:
    out = tmp_path / "for-peers.jsonl"
    proc = slogate("convert", samples.path(samples.MOONCAKE_CONVERSATION), out, "--to", "mooncake")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1750
    for row in rows:
        jsonschema.validate(row, MOONCAKE_SCHEMA)
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    text = proc.stdout
    assert f"--input-file {out} --custom-dataset-type mooncake_trace --fixed-schedule" in text
    assert "--dataset-name timed_trace" in text
    assert "--timed-trace-chunk-hash-size 512 --timed-trace-sec-multiplier 0.001 --num-prompts 1750" in text
    assert "--dataset-name mooncake" in text and "--use-trace-timestamps true" in text
    assert "guidellm benchmark" in text and "--max-requests 1750" in text
