"""Where a workload comes from: a trace file in any format `traces.formats` reads, as planned requests.

Reads the file once (through `traces.formats.load`), hashes it for the results' environment and
turns records into a `Workload`. Never parses a trace format itself; errors become `UsageError`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.replay.workload import Workload, from_records
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.stats import block_tokens  # tokens per hash id of a header (bytes → tokens)
from slogate.traces.usage import UsageError
from slogate.traces.validate import problems


class LoadedTrace(msgspec.Struct):
    header: TraceHeader
    records: list[RequestRecord]
    path: str
    fmt: str
    digest: str  # sha256 of the file bytes (of every segment, in order, for a directory)


def load_trace(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], fmt: str | None = None, *,
               block_size: int | None = None) -> LoadedTrace:
    """Read a trace (several files: slogate segments or agentic sessions); a missing file or an
    unknown format is a one-line `UsageError`. `block_size`: tokens per hash id (Mooncake files)."""
    from slogate.traces import formats
    from slogate.traces.segments import TraceError

    paths = [Path(path)] if isinstance(path, str | os.PathLike) else [Path(q) for q in path]
    for p in paths:
        if not p.exists():
            raise UsageError(f"no such trace file: {p}")
    if block_size is not None and block_size < 1:
        raise UsageError(f"bad --block-size {block_size}: tokens per hash id, e.g. 16, 64 or 512")
    try:
        fmt = fmt or formats.guess_format(paths[0])
        header, records = formats.load(paths if len(paths) > 1 else paths[0], fmt, block_size=block_size)
    except (formats.FormatError, TraceError) as exc:
        raise UsageError(str(exc)) from None
    except (ValueError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read trace {paths[0]} as {fmt}: {exc}") from None
    wrong = problems(records, measured=False, limit=1)  # what would be replayed as something else
    if wrong:
        raise UsageError(f"trace {paths[0]}: {wrong[0]} (slogate trace validate lists every problem)")
    if block_size is not None and fmt != "mooncake":
        header.block_size, header.block_unit = block_size, "tokens"
    name = str(paths[0]) if len(paths) == 1 else ",".join(p.name for p in paths)
    return LoadedTrace(header=header, records=records, path=name, fmt=fmt or "", digest=digest(*paths))


def digest(*paths: Path) -> str:
    h = hashlib.sha256()
    files = [f for path in paths for f in (sorted(q for q in path.iterdir() if q.is_file()) if path.is_dir() else [path])]
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def trace_workload(trace: LoadedTrace) -> Workload:
    bs = block_tokens(trace.header)
    return Workload(requests=from_records(trace.records, default_block_size=None), block_size=bs,
                    source=f"trace:{os.path.basename(trace.path)}")
