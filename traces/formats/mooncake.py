"""Mooncake JSONL traces (`timestamp` ms, `input_length`, `output_length`, `hash_ids`) in and out.

The format AIPerf (`mooncake_trace`), vLLM `bench serve` and SGLang replay: one JSON object per
line, hash ids are 512-token chained prefix blocks. Import keeps the ids as they are (header
block_size=512, block_unit="tokens"), so Mooncake → slogate → Mooncake is lossless. Export of
other traces remaps ids to small integers in first-seen order and coarsens them to 512-token
blocks: every k-th chained id is kept (k = 512 / block tokens; byte blocks count ~4 bytes per
token, so 256-byte blocks give k = 8) plus the last one, and the list is fitted to
ceil(input_length / 512) entries (cut, or padded with fresh ids that share nothing). AIPerf's
multi-turn form (`session_id`, `delay` ms after the previous turn, `timestamp` optional) imports as
sessions with turns and think times; `block_size` (16, 64, 512) overrides the 512-token blocks of
files cut differently; `.jsonl.gz` is read through gzip.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import math
import os
import zlib
from collections.abc import Sequence

import msgspec

from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError

NAME = "mooncake"
SUFFIXES = (".jsonl", ".json", ".jsonl.gz")
MOONCAKE_BLOCK_TOKENS = 512
BYTES_PER_TOKEN = 4  # assumed when coarsening byte blocks to token blocks


class MooncakeRow(msgspec.Struct):
    input_length: int
    output_length: int
    timestamp: float | None = None  # ms; AIPerf: only on a session's first turn (or absent)
    hash_ids: list[int] = []
    session_id: str | int | None = None
    delay: float | None = None  # ms after the previous turn of the session (AIPerf mooncake_trace)


_decoder = msgspec.json.Decoder(MooncakeRow)


def sniff(head: bytes) -> bool:
    first = head.lstrip()[:1] == b"{" and head.split(b"\n", 1)[0]
    return bool(first) and b'"input_length"' in first and b'"kind"' not in first


def load(path: str | os.PathLike[str], *, block_size: int = MOONCAKE_BLOCK_TOKENS
         ) -> tuple[TraceHeader, list[RequestRecord]]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(path, data)
    data = data.removeprefix(codecs.BOM_UTF8)  # a UTF-8 byte-order mark some editors write first
    try:
        rows = _decoder.decode_lines(data)
    except msgspec.DecodeError as exc:
        raise TraceError(path, _locate(data, exc)) from None
    records = []
    last: dict[str, RequestRecord] = {}  # session → its latest turn
    for row in rows:
        session = None if row.session_id is None else str(row.session_id)
        prev = last.get(session) if session is not None else None
        think = None if row.delay is None else row.delay / 1000.0
        if row.timestamp is not None:
            t = row.timestamp / 1000.0
        else:
            t = (prev.t if prev is not None else 0.0) + (think or 0.0)
        rec = RequestRecord(t=t, input_tokens=row.input_length, output_tokens=row.output_length,
                            hash_ids=row.hash_ids)
        if session is not None:
            rec.session, rec.turn, rec.think = session, 0 if prev is None else (prev.turn or 0) + 1, think
            last[session] = rec
        records.append(rec)
    if any(r.t < q.t for q, r in itertools.pairwise(records)):
        records.sort(key=lambda r: r.t)
    header = TraceHeader(block_size=block_size, block_unit="tokens", tokens_source="usage",
                         source="import:mooncake")
    return header, records


def _gunzip(path: str | os.PathLike[str], data: bytes) -> bytes:
    """The content of a gzip file; a cut or corrupt one is a `TraceError` naming the file and the fix."""
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceError(path, f"cannot read as gzip ({exc}): the file is cut or corrupt; "
                         "copy it again or decompress what is left with zcat") from None


def _locate(data: bytes, exc: Exception) -> str:
    for n, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            try:
                _decoder.decode(line)
            except msgspec.DecodeError as line_exc:
                return f"line {n}: {line_exc} (expected timestamp, input_length, output_length, hash_ids)"
    return str(exc)


def keeps_ids(header: TraceHeader) -> bool:
    """True when the ids already are Mooncake's (imported from Mooncake): exported unchanged."""
    return (
        header.block_unit == "tokens"
        and header.block_size == MOONCAKE_BLOCK_TOKENS
        and (header.source or "").startswith("import:mooncake")
    )


def coarsen_factor(block_size: int, block_unit: str) -> int:
    """How many of our blocks make one 512-token Mooncake block."""
    tokens = block_size if block_unit == "tokens" else block_size / BYTES_PER_TOKEN
    return max(1, round(MOONCAKE_BLOCK_TOKENS / tokens))


class IdMapper:
    """Small integers in first-seen order for 64-bit ids, coarsened to 512-token blocks."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._next = 0

    def _small(self, hash_id: int | None) -> int:
        """The small id of `hash_id`; a fresh one that matches nothing for None."""
        if hash_id is not None and hash_id in self._ids:
            return self._ids[hash_id]
        value, self._next = self._next, self._next + 1
        if hash_id is not None:
            self._ids[hash_id] = value
        return value

    def map(self, hash_ids: Sequence[int], k: int, input_length: int | None) -> list[int]:
        n = len(hash_ids)
        kept = [hash_ids[min(j * k + k - 1, n - 1)] for j in range(math.ceil(n / k))]
        want = len(kept) if input_length is None else math.ceil(max(0, input_length) / MOONCAKE_BLOCK_TOKENS)
        out = [self._small(h) for h in kept[:want]]
        return out + [self._small(None) for _ in range(want - len(out))]


def save(path: str | os.PathLike[str], header: TraceHeader, records: Sequence[RequestRecord]) -> int:
    unchanged = keeps_ids(header)
    mapper = IdMapper()
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            ids = r.hash_ids or []
            if not unchanged and (ids or r.input_tokens):
                block_size = r.block_size or header.block_size
                ids = mapper.map(ids, coarsen_factor(block_size, header.block_unit), r.input_tokens)
            f.write(
                f'{{{_when(r)}"input_length": {r.input_tokens or 0}, '
                f'"output_length": {r.output_tokens or 0}, "hash_ids": [{", ".join(map(str, ids))}]}}\n'
            )
    return len(records)


def _when(r: RequestRecord) -> str:
    """`"timestamp": MS, `; for a session's turn AIPerf's multi-turn form: `session_id`, and on a later
    turn with a think time `delay` (ms after the previous turn) instead of the timestamp, as imported."""
    if r.session is None:
        return f'"timestamp": {round(r.t * 1000)}, '
    sid = f'"session_id": {msgspec.json.encode(r.session).decode()}, '
    if r.turn and r.think is not None:
        return f'{sid}"delay": {_ms(r.think)}, '
    return f'{sid}"timestamp": {round(r.t * 1000)}, '


def _ms(seconds: float) -> int | float:
    """Milliseconds, an integer when whole (the way the files write them)."""
    ms = round(seconds * 1000, 6)
    return int(ms) if ms == int(ms) else ms
