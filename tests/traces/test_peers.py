"""`slogate trace convert --to mooncake` writes a file every peer's documented Mooncake schema accepts and
prints the exact commands that run it (AIPerf mooncake_trace, vLLM timed_trace, SGLang, guidellm)."""

from __future__ import annotations

import json

import jsonschema
import pytest

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


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
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


def test_parquet_and_csv_exports_read_back_equal(tmp_path) -> None:
    import csv

    import pyarrow.parquet as pq  # the test extra installs pyarrow (make test)

    from slogate.traces import formats
    from slogate.traces.formats.columns import NAMES, row

    src = samples.path(samples.MOONCAKE_CONVERSATION)
    trace = tmp_path / "t.jsonl.zst"
    assert slogate("convert", src, trace).returncode == 0
    _, records = formats.load(trace)
    pfile, cfile = tmp_path / "t.parquet", tmp_path / "t.csv"
    proc = slogate("convert", trace, pfile)  # .parquet is guessed from the name
    assert proc.returncode == 0 and "(parquet)" in proc.stdout, proc.stderr
    assert slogate("convert", trace, cfile, "--to", "csv").returncode == 0
    table = pq.read_table(pfile)
    assert table.column_names == list(NAMES) and table.num_rows == len(records) == 1750
    assert table.to_pylist() == [dict(zip(NAMES, row(r), strict=True)) for r in records]
    assert b"slogate.header" in table.schema.metadata
    with open(cfile, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1750 and list(rows[0]) == list(NAMES)
    assert [int(x["input_tokens"]) for x in rows] == [r.input_tokens for r in records]
    proc = slogate("stats", pfile)
    assert proc.returncode == 2 and "cannot tell the trace format" in proc.stderr, proc.stderr  # not a trace input
