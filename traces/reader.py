"""Reading trace format v1: records from one or many segments, merged in arrival order.

Decodes frame by frame (zstd streaming, msgspec typed line decoding). A frame that fails type
validation is decoded again line by line, reading slogate 0.1 error names as today's classes
(`LEGACY_ERRORS`). A cut last frame (a crash, or a file copied while being written) is read up to the
cut: the whole lines of its complete zstd blocks are records (`recovered`), the partial last line and
the bytes after the last block that completed a line are reported in `skipped_bytes`; anything else
unreadable raises `TraceError` naming the file and byte offset, and so do segments read as one trace
that were hashed differently (another salt or block size: two gateways sharing a directory). Never
writes, and never yields a partial line.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec
import zstandard

from slogate.traces.record import LEGACY_ERRORS, SCHEMA_VERSION, RequestRecord, TraceHeader
from slogate.traces.segments import ZSTD_MAGIC, TraceError, list_segments

READ_CHUNK = 1 << 20
_HEADER_START = b'{"kind":"header"'

_record_decoder = msgspec.json.Decoder(RequestRecord)
_header_decoder = msgspec.json.Decoder(TraceHeader)
_untyped_decoder = msgspec.json.Decoder()

PathLike = str | os.PathLike[str]


class Trace(msgspec.Struct):
    """A whole trace in memory: the (first) header and the records in arrival order."""

    header: TraceHeader
    records: list[RequestRecord]
    files: list[str]
    skipped_bytes: int = 0  # bytes at the end of cut files that yielded no record (a crash)
    truncated: list[str] = []  # files cut short (in their last frame, or a plain file in its last line)
    recovered: int = 0  # records read from the cut last frames


class SegmentReader:
    """Iterates the records of one segment file in file order; `header`, `skipped_bytes`, `cut` and
    `recovered` fill in as it reads."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        self.header: TraceHeader | None = None
        self.skipped_bytes = 0  # bytes at the end of a cut file that yielded no record
        self.cut = False  # the file ends inside a frame (or a plain file inside a line)
        self.recovered = 0  # records read from a cut last frame
        self.records = 0

    def __iter__(self) -> Iterator[RequestRecord]:
        for offset, data in self._chunks():
            records = self._decode(offset, data)
            self.recovered += len(records) if self.cut else 0
            yield from records

    def read(self) -> list[RequestRecord]:
        out: list[RequestRecord] = []
        with _gc_paused():
            for offset, data in self._chunks():
                records = self._decode(offset, data)
                self.recovered += len(records) if self.cut else 0
                out += records
        return out

    # -- frames --------------------------------------------------------------------------------------

    def _chunks(self) -> Iterator[tuple[int, bytes]]:
        """(file offset, decompressed bytes) of each complete frame (or the whole text of a plain file)."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below, generator
        except OSError as exc:
            raise TraceError(self.path, f"cannot open: {exc.strerror}") from None
        with f:
            magic = f.read(4)
            f.seek(0)
            if magic and magic != ZSTD_MAGIC[: len(magic)]:
                if magic[:1] != b"{":
                    raise TraceError(self.path, "not a slogate trace (neither zstd nor JSON lines)", offset=0)
                yield from self._plain(f)
                return
            yield from self._frames(f)

    def _frames(self, f: BinaryIO) -> Iterator[tuple[int, bytes]]:
        dctx = zstandard.ZstdDecompressor()
        dobj = dctx.decompressobj()
        start, fed, parts = 0, 0, []
        while chunk := f.read(READ_CHUNK):
            while chunk:
                try:
                    out = dobj.decompress(chunk)
                except zstandard.ZstdError as exc:
                    raise TraceError(self.path, f"corrupt zstd frame ({exc})", offset=start) from None
                if out:
                    parts.append(out)
                if not dobj.eof:
                    fed += len(chunk)
                    break
                rest = dobj.unused_data
                yield start, b"".join(parts)
                start += fed + len(chunk) - len(rest)
                fed, parts, chunk = 0, [], rest
                dobj = dctx.decompressobj()
        if fed:  # an incomplete last frame: the writer was cut off mid-frame
            data, self.skipped_bytes = self._cut_frame(f, start)
            self.cut = True
            if data:
                yield start, data

    def _cut_frame(self, f: BinaryIO, start: int) -> tuple[bytes, int]:
        """The whole lines a cut frame still holds, and how many bytes of the file after the last of them
        yield no record. Its blocks are decoded one by one: a compressed block only when complete, a raw
        (stored) block byte by byte, so a line's end is known to the block, or to the byte in a raw one."""
        f.seek(start)
        frame = f.read()
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out, kept, kept_at, pos = bytearray(), 0, 0, 0
        for content, end, raw in _blocks(frame):
            before = len(out)
            try:
                out += dobj.decompress(frame[pos:end])
            except zstandard.ZstdError as exc:
                raise TraceError(self.path, f"corrupt zstd frame ({exc})", offset=start) from None
            pos = end
            if (line_end := out.rfind(b"\n") + 1) > kept:
                kept, kept_at = line_end, content + line_end - before if raw else end
        return bytes(out[:kept]), len(frame) - kept_at

    def _plain(self, f: BinaryIO) -> Iterator[tuple[int, bytes]]:
        """Uncompressed JSON lines (handy for hand-made files): a cut last line is skipped."""
        data = f.read()
        end = data.rfind(b"\n") + 1
        self.skipped_bytes = len(data) - end
        self.cut = end < len(data)
        yield 0, data[:end]

    # -- lines ---------------------------------------------------------------------------------------

    def _decode(self, offset: int, data: bytes) -> list[RequestRecord]:
        if self.header is None:
            if not data.startswith(_HEADER_START):
                raise TraceError(self.path, 'no header line: a trace segment starts with {"kind":"header",...}', offset=offset)
            line, _, data = data.partition(b"\n")
            try:
                self.header = _header_decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise TraceError(self.path, f"bad header line: {exc}", offset=offset) from None
            if self.header.schema_version > SCHEMA_VERSION:
                raise TraceError(
                    self.path, f"schema version {self.header.schema_version} is newer than this slogate "
                    f"(reads up to {SCHEMA_VERSION}): upgrade slogate", offset=offset,
                )
        try:
            records = _record_decoder.decode_lines(data)
        except msgspec.DecodeError:
            records = self._decode_lenient(offset, data)
        self.records += len(records)
        return records

    def _decode_lenient(self, offset: int, data: bytes) -> list[RequestRecord]:
        """Line by line, 0.1 error names mapped (the slow path); a bad line raises TraceError."""
        out: list[RequestRecord] = []
        for n, line in enumerate(data.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                out.append(_legacy_record(line))
            except msgspec.DecodeError as exc:
                raise TraceError(
                    self.path, f"bad record on line {n} of the frame starting here: {exc}", offset=offset
                ) from None
        return out


def _blocks(frame: bytes) -> list[tuple[int, int, bool]]:
    """(content start, end, raw) of each block of a cut zstd frame, the last one cut where the data ends.
    Blocks follow the frame header, each a 3-byte little-endian head (bit 0: last block, bits 1-2: type
    0 raw / 1 RLE / 2 compressed, the rest: size) and its bytes (1 for RLE). Empty for a frame cut in its
    header, or for a skippable frame (it holds no lines)."""
    if not frame.startswith(ZSTD_MAGIC):
        return []
    try:
        pos = zstandard.frame_header_size(frame)
    except zstandard.ZstdError:
        return []
    blocks: list[tuple[int, int, bool]] = []
    while pos + 3 <= len(frame):
        head = int.from_bytes(frame[pos:pos + 3], "little")
        kind = (head >> 1) & 3
        end = pos + 3 + (1 if kind == 1 else head >> 3)
        blocks.append((pos + 3, min(end, len(frame)), kind == 0))
        if head & 1 or end >= len(frame):
            break
        pos = end
    return blocks


def _legacy_record(line: bytes) -> RequestRecord:
    """One record line, its error name read through LEGACY_ERRORS (slogate 0.1 names)."""
    try:
        return _record_decoder.decode(line)
    except msgspec.ValidationError:
        obj = _untyped_decoder.decode(line)
        if not isinstance(obj, dict) or obj.get("error") not in LEGACY_ERRORS:
            raise
    obj["error"] = LEGACY_ERRORS[obj["error"]]
    return msgspec.convert(obj, RequestRecord)


def segment_paths(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """Expand directories to their segments; keep files as given."""
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = list_segments(p)
            if not found:
                raise TraceError(p, "directory holds no *.jsonl.zst segments")
            out += found
        else:
            out.append(p)
    return out


def read_trace(paths: PathLike | Iterable[PathLike], *, sort: bool = True) -> Trace:
    """Read segments into one trace, records in arrival order (`t`).

    Segments of one capture share `start_unix`; when files from different captures are merged
    (different wall-clock starts, all known) their `t` are shifted onto the earliest start.
    """
    files = segment_paths(paths)
    readers = [SegmentReader(p) for p in files]
    chunks = [r.read() for r in readers]
    _check_hashing(readers, chunks)
    headers = [r.header for r in readers if r.header is not None]
    header = headers[0] if headers else TraceHeader()
    starts = {h.start_unix for h in headers}
    if len(starts) > 1 and min(starts) > 0:
        base = min(starts)
        header = msgspec.structs.replace(header, start_unix=base)
        for reader, recs in zip(readers, chunks, strict=True):
            shift = (reader.header.start_unix - base) if reader.header else 0.0
            if shift:
                for r in recs:
                    r.t += shift
    records = chunks[0] if len(chunks) == 1 else [r for recs in chunks for r in recs]
    if sort and any(a.t > b.t for a, b in itertools.pairwise(records)):
        records.sort(key=_arrival)
    return Trace(
        header=header,
        records=records,
        files=[str(p) for p in files],
        skipped_bytes=sum(r.skipped_bytes for r in readers),
        truncated=[str(r.path) for r in readers if r.cut],
        recovered=sum(r.recovered for r in readers),
    )


def _check_hashing(readers: Sequence[SegmentReader], chunks: Sequence[list[RequestRecord]]) -> None:
    """Segments read as one trace must share their hashing: one salt (ids and session hashes of different
    salts never match) and, when their records carry hash ids, one block size. Two gateways (or a gateway
    restarted with a new salt) writing into one directory would otherwise be read as one capture under
    the first header's salt and blocks, and `trace merge` could not refuse them."""
    salt: tuple[str, Path] | None = None
    blocks: tuple[tuple[int, str], Path] | None = None
    for reader, records in zip(readers, chunks, strict=True):
        h = reader.header
        if h is None:
            continue
        if h.salt_id:
            salt = salt or (h.salt_id, reader.path)
            if h.salt_id != salt[0]:
                raise TraceError(reader.path, f"hashed with salt {h.salt_id}, but {salt[1]} with {salt[0]}: "
                                 "their prefix ids and sessions never match; read each capture on its own "
                                 "(give each gateway its own --trace-dir, or move one's segments out)")
        if any(r.hash_ids for r in records):
            size = (h.block_size, h.block_unit)
            blocks = blocks or (size, reader.path)
            if size != blocks[0]:
                raise TraceError(reader.path, f"prefix blocks of {size[0]} {size[1]}, but {blocks[1]} has "
                                 f"{blocks[0][0]} {blocks[0][1]}: read each capture on its own "
                                 "(give each gateway its own --trace-dir, or move one's segments out)")


def _arrival(record: RequestRecord) -> float:
    return record.t


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while decoding, and what was decoded goes straight to the oldest generation.

    Records are acyclic but their `hash_ids` lists are GC-tracked: a million of them would be walked
    (every int touched) by the next young collection and again by the middle one before they reach
    the oldest generation. `gc.freeze()` + `gc.unfreeze()` moves every tracked object there at once,
    without a pass; skipped when the program keeps objects frozen itself (unfreeze would release them).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()
