"""Azure LLM inference CSV traces (`TIMESTAMP,ContextTokens,GeneratedTokens`), 2023 and 2024 layouts.

2023 (Splitwise): naive wall-clock `2023-11-16 18:15:46.6805900` (7 fraction digits, no zone).
2024 (DynamoLLM): `2024-05-10 00:00:00.009930+00:00` (6 digits, omitted when zero, UTC offset).
Timestamps are parsed by hand into integer 100 ns ticks, so Azure → slogate → Azure gives back every
row byte for byte (the header's `start_unix` keeps microseconds; `t` carries the rest). Naive 2023
times are taken as UTC. Never reads columns other than those three.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
from collections.abc import Sequence
from typing import Literal

from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError

NAME = "azure"
SUFFIXES = (".csv",)
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TICKS = 10_000_000  # 100 ns ticks per second
_EPOCH = dt.date(1970, 1, 1)
Layout = Literal["2023", "2024"]


def sniff(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return all(c.encode() in first for c in COLUMNS)


class _Clock:
    """Parses and formats Azure timestamps, caching the per-day part."""

    def __init__(self) -> None:
        self._day_ticks: dict[str, int] = {}
        self._day_text: dict[int, str] = {}

    def parse(self, text: str) -> tuple[int, bool]:
        """(100 ns ticks since the epoch, has a zone suffix) of `YYYY-MM-DD HH:MM:SS[.f…][Z|±HH:MM]`."""
        if not text.isascii():  # int() and isdigit() would take other scripts' digits
            raise ValueError(text)
        day = self._day_ticks.get(text[:10])
        if day is None:
            day = (dt.date.fromisoformat(text[:10]) - _EPOCH).days * 86400 * TICKS
            self._day_ticks[text[:10]] = day
        if text[10] not in " T" or text[13] != ":" or text[16] != ":":
            raise ValueError(text)
        ticks = day + (int(text[11:13]) * 3600 + int(text[14:16]) * 60 + int(text[17:19])) * TICKS
        rest = text[19:]
        zoned = False
        if rest.startswith("."):
            end = 1
            while end < len(rest) and rest[end].isdigit():
                end += 1
            digits = rest[1:end]
            if not digits or len(digits) > 7:
                raise ValueError(text)
            ticks += int(digits.ljust(7, "0"))
            rest = rest[end:]
        if rest:
            zoned = True
            if rest != "Z":
                sign = -1 if rest[0] == "-" else 1
                if rest[0] not in "+-" or len(rest) != 6 or rest[3] != ":":
                    raise ValueError(text)
                ticks -= sign * (int(rest[1:3]) * 3600 + int(rest[4:6]) * 60) * TICKS
        return ticks, zoned

    def format(self, ticks: int, layout: Layout) -> str:
        seconds, frac = divmod(ticks, TICKS)
        days, secs = divmod(seconds, 86400)
        date = self._day_text.get(days)
        if date is None:
            date = self._day_text[days] = (_EPOCH + dt.timedelta(days=days)).isoformat()
        hh, rem = divmod(secs, 3600)
        mm, ss = divmod(rem, 60)
        if layout == "2023":
            return f"{date} {hh:02d}:{mm:02d}:{ss:02d}.{frac:07d}"
        micros = frac // 10
        fraction = f".{micros:06d}" if micros else ""
        return f"{date} {hh:02d}:{mm:02d}:{ss:02d}{fraction}+00:00"


def _int(value: str) -> int | None:
    return int(value) if value.strip() else None


def load(path: str | os.PathLike[str]) -> tuple[TraceHeader, list[RequestRecord]]:
    clock = _Clock()
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: skips a byte-order mark
        reader = csv.reader(f)
        names = [n.strip() for n in next(reader, [])]
        if any(c not in names for c in COLUMNS):
            raise TraceError(path, f"not an Azure LLM trace: the header must name {', '.join(COLUMNS)}", offset=0)
        i_ts, i_in, i_out = (names.index(c) for c in COLUMNS)
        rows: list[tuple[int, int | None, int | None]] = []
        zoned = False
        for row in reader:
            if not row:
                continue
            try:
                ticks, zoned = clock.parse(row[i_ts].strip())
                rows.append((ticks, _int(row[i_in]), _int(row[i_out])))
            except (ValueError, IndexError):
                raise TraceError(
                    path, f"line {reader.line_num}: bad row {','.join(row)!r} "
                    "(expected TIMESTAMP like 2023-11-16 18:15:46.6805900, then two integers)"
                ) from None
    layout: Layout = "2024" if zoned else "2023"
    start = (min(r[0] for r in rows) // 10 * 10) if rows else 0  # whole microseconds: exact as a float
    header = TraceHeader(start_unix=start / TICKS, tokens_source="usage", source=f"import:azure-{layout}")
    records = [RequestRecord(t=(ticks - start) / TICKS, input_tokens=i, output_tokens=o) for ticks, i, o in rows]
    return header, records


def layout_of(header: TraceHeader) -> Layout:
    """2023 for traces imported from a 2023 file, else the unambiguous 2024 layout (UTC offset)."""
    return "2023" if (header.source or "").endswith("azure-2023") else "2024"


def save(
    path: str | os.PathLike[str], header: TraceHeader, records: Sequence[RequestRecord], layout: Layout | None = None
) -> int:
    layout = layout or layout_of(header)
    if layout not in ("2023", "2024"):
        raise ValueError(f"unknown Azure layout {layout!r}: use 2023 or 2024")
    clock = _Clock()
    start = round(header.start_unix * 1_000_000) * 10
    out = io.StringIO()
    out.write(",".join(COLUMNS) + "\r\n")
    for r in records:
        ts = clock.format(start + round(r.t * TICKS), layout)
        i = "" if r.input_tokens is None else r.input_tokens
        o = "" if r.output_tokens is None else r.output_tokens
        out.write(f"{ts},{i},{o}\r\n")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(out.getvalue())
    return len(records)
