"""Export (only) of records as a flat CSV table, one row per request (`--to csv`), for pandas/DuckDB.

Columns from `formats.columns`; empty cells for unknown values. Never read back as a trace (no
timing semantics beyond the columns) and never carries prompt text.
"""

from __future__ import annotations

import csv as _csv
import os
from collections.abc import Sequence
from typing import NoReturn

from slogate.traces.formats.columns import NAMES, row
from slogate.traces.record import RequestRecord, TraceHeader

SUFFIXES = ()  # never guessed: `.csv` names mean Azure; ask for this one with --to csv


def sniff(head: bytes) -> bool:
    return False


def load(path: str | os.PathLike[str]) -> NoReturn:
    from slogate.traces.formats import FormatError

    raise FormatError(f"{path}: csv is an export format; read it with pandas or DuckDB, or convert the source trace")


def save(path: str | os.PathLike[str], header: TraceHeader, records: Sequence[RequestRecord]) -> int:
    with open(path, "w", newline="") as f:
        w = _csv.writer(f)
        w.writerow(NAMES)
        for r in records:
            w.writerow(["" if v is None else v for v in row(r)])
    return len(records)
