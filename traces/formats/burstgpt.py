"""BurstGPT CSV traces (HPMLL/BurstGPT): read by column name; import only.

Columns used: `Timestamp` (seconds from midnight of the first day), `Model`, `Request tokens`,
`Response tokens`. A row with zero response tokens is a failed request (status 500, error class
"unknown": the trace does not say why). Other columns (`Total tokens`, `Log Type`, session columns) are ignored.
"""

from __future__ import annotations

import csv
import os

from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError

NAME = "burstgpt"
SUFFIXES = ()  # never guessed from a name: BurstGPT files are .csv like Azure's, told apart by content
REQUIRED = ("Timestamp", "Request tokens", "Response tokens")


def sniff(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return all(c.encode() in first for c in REQUIRED)


def load(path: str | os.PathLike[str]) -> tuple[TraceHeader, list[RequestRecord]]:
    records: list[RequestRecord] = []
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: skips a byte-order mark
        reader = csv.reader(f)
        names = [n.strip() for n in next(reader, [])]
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise TraceError(path, f"not a BurstGPT trace: missing column(s) {', '.join(missing)}", offset=0)
        i_ts, i_in, i_out = (names.index(c) for c in REQUIRED)
        i_model = names.index("Model") if "Model" in names else None
        for row in reader:
            if not row:
                continue
            try:
                t, tokens_in, tokens_out = float(row[i_ts]), int(row[i_in]), int(row[i_out])
            except (ValueError, IndexError):
                raise TraceError(
                    path, f"line {reader.line_num}: bad row {','.join(row)!r} (expected numbers in "
                    f"{', '.join(REQUIRED)})"
                ) from None
            failed = tokens_out == 0
            records.append(RequestRecord(
                t=t,
                model=row[i_model] if i_model is not None else None,
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                status=500 if failed else 200,
                error="unknown" if failed else None,
            ))
    return TraceHeader(tokens_source="usage", source="import:burstgpt"), records
