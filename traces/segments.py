"""Trace format v1 on disk: segment names, line encoding and zstd frames (shared by writer and reader).

A segment is `<prefix>-<UTC stamp>-<seq>.jsonl.zst`: independently flushed zstd frames holding JSON
lines, the first line a `TraceHeader`, then one `RequestRecord` per line. Never does file I/O
beyond `write_segment` (the synchronous, offline writer used by conversions).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec
import zstandard

from slogate.traces.record import RequestRecord, TraceHeader

SUFFIX = ".jsonl.zst"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
COMPRESSION_LEVEL = 3
OFFLINE_FRAME_RECORDS = 8192  # records per frame when writing a whole file at once


class TraceError(Exception):
    """A trace file that cannot be read: names the file and, when known, the byte offset."""

    def __init__(self, path: str | os.PathLike[str], message: str, offset: int | None = None):
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{os.fspath(path)}{where}: {message}")
        self.path = os.fspath(path)
        self.offset = offset


def segment_name(prefix: str, seq: int, now: float | None = None) -> str:
    """Sortable file name: `slogate-20260131T120000Z-000003.jsonl.zst` (UTC open time, sequence)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{prefix}-{stamp}-{seq:06d}{SUFFIX}"


def segment_prefix(name: str) -> str:
    """The writer's prefix of a name `segment_name` made (`slogate-w1g0` of
    `slogate-w1g0-20260131T120000Z-000003.jsonl.zst`); a name of another form is its own."""
    parts = name.removesuffix(SUFFIX).rsplit("-", 2)
    return parts[0] if len(parts) == 3 and parts[1].endswith("Z") and parts[2].isdigit() else name


def is_segment(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).endswith(SUFFIX)


def list_segments(directory: str | os.PathLike[str]) -> list[Path]:
    """Segment files of a capture directory, in name (= time, then sequence) order."""
    return sorted(p for p in Path(directory).iterdir() if p.is_file() and is_segment(p))


_encoder = msgspec.json.Encoder()


# Written even at their defaults: a reader must never take them from its own defaults. A newer writer
# whose default schema_version is 2 would otherwise write none, and this reader would read its file as v1.
EXPLICIT_HEADER_FIELDS = ("schema_version", "block_size", "block_unit")


def encode_header(header: TraceHeader) -> bytes:
    """The header line: `{"kind":"header","schema_version":…,"block_size":…,"block_unit":…,…}`."""
    fields = msgspec.json.decode(_encoder.encode(header))
    line = {"kind": fields.pop("kind"), **{k: getattr(header, k) for k in EXPLICIT_HEADER_FIELDS}, **fields}
    return _encoder.encode(line) + b"\n"


def encode_records(records: Iterable[RequestRecord], buffer: bytearray | None = None) -> bytearray:
    """Append one JSON line per record to `buffer` (a new one when None) and return it."""
    out = bytearray() if buffer is None else buffer
    encode_into = _encoder.encode_into
    for record in records:
        encode_into(record, out, -1)
        out += b"\n"
    return out


def compressor(level: int = COMPRESSION_LEVEL) -> zstandard.ZstdCompressor:
    """Frames carry their content size and a checksum, so a reader can tell a cut frame from a good one."""
    return zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)


def write_segment(
    path: str | os.PathLike[str],
    header: TraceHeader,
    records: Iterable[RequestRecord],
    *,
    frame_records: int = OFFLINE_FRAME_RECORDS,
) -> int:
    """Write a whole segment at once (header frame, then frames of `frame_records` lines); returns records written."""
    cctx = compressor()
    count = 0
    with open(path, "wb") as f:
        f.write(cctx.compress(encode_header(header)))
        batch: list[RequestRecord] = []
        for record in records:
            batch.append(record)
            if len(batch) >= frame_records:
                f.write(cctx.compress(bytes(encode_records(batch))))
                count += len(batch)
                batch.clear()
        if batch:
            f.write(cctx.compress(bytes(encode_records(batch))))
            count += len(batch)
    return count
