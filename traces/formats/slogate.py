"""slogate's own trace format v1 (zstd JSON-lines segments) as a `traces.formats` entry.

Thin adapter over `traces.reader` and `traces.segments`: loading merges segments in arrival
order; saving writes one segment. Never changes records on the way through.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import SUFFIX, ZSTD_MAGIC, write_segment

NAME = "slogate"
SUFFIXES = (SUFFIX, ".zst")


def sniff(head: bytes) -> bool:
    return head.startswith(ZSTD_MAGIC) or head.startswith(b'{"kind":"header"')


def load(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> tuple[TraceHeader, list[RequestRecord]]:
    trace = read_trace(paths)
    return trace.header, trace.records


def save(path: str | os.PathLike[str], header: TraceHeader, records: Sequence[RequestRecord]) -> int:
    return write_segment(path, header, records)
