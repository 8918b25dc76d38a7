"""`DIR/requests.jsonl.zst`: every measured request as a slogate trace (format v1), so a replay's
output can itself be replayed, compared or imported. Uses the traces writer; never edits records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import write_segment

FILE = "requests.jsonl.zst"


def write(header: TraceHeader, records: Sequence[RequestRecord], directory: str | Path) -> Path:
    path = Path(directory) / FILE
    write_segment(path, header, records)
    return path


def read(directory: str | Path) -> tuple[TraceHeader, list[RequestRecord]]:
    from slogate.traces.reader import read_trace

    trace = read_trace([Path(directory) / FILE])
    return trace.header, trace.records
