"""Where a workload comes from: a trace file in any format `traces.formats` reads, as planned requests.

Reads the file once (through `traces.formats.load`), hashes it for the results' environment and
turns records into a `Workload`. Never parses a trace format itself; errors become `UsageError`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

from slogate.replay.workload import Workload, from_records
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.usage import UsageError

BYTES_PER_TOKEN = 4  # byte blocks (gateway capture without a tokenizer) → token blocks


class LoadedTrace(msgspec.Struct):
    header: TraceHeader
    records: list[RequestRecord]
    path: str
    fmt: str
    digest: str  # sha256 of the file bytes (of every segment, in order, for a directory)


def load_trace(path: str | os.PathLike[str], fmt: str | None = None) -> LoadedTrace:
    """Read a trace; a missing file or an unknown format is a one-line `UsageError`."""
    from slogate.traces import formats
    from slogate.traces.segments import TraceError

    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such trace file: {path}")
    try:
        fmt = fmt or formats.guess_format(p)
        header, records = formats.load(p, fmt)
    except (formats.FormatError, TraceError) as exc:
        raise UsageError(str(exc)) from None
    except (ValueError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read trace {path} as {fmt}: {exc}") from None
    return LoadedTrace(header=header, records=records, path=str(p), fmt=fmt or "", digest=digest(p))


def digest(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(q for q in path.iterdir() if q.is_file()) if path.is_dir() else [path]
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def block_tokens(header: TraceHeader) -> int:
    """Tokens per prefix block: the header's block size, converted from bytes when needed."""
    if header.block_unit == "tokens":
        return max(1, header.block_size)
    return max(1, header.block_size // BYTES_PER_TOKEN)


def trace_workload(trace: LoadedTrace) -> Workload:
    bs = block_tokens(trace.header)
    return Workload(requests=from_records(trace.records, default_block_size=None), block_size=bs,
                    source=f"trace:{os.path.basename(trace.path)}")
