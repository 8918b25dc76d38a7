"""Export (only) of records as a Parquet table, one row per request (`--to parquet`, extra `slogate[parquet]`).

Columns and types from `formats.columns`; nulls for unknown values; the trace header's block size and
SLOs go into the file's key-value metadata. pyarrow is imported lazily. Never carries prompt text.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NoReturn

import msgspec

from slogate.traces.formats.columns import COLUMNS, columns
from slogate.traces.record import RequestRecord, TraceHeader

SUFFIXES = (".parquet",)


def sniff(head: bytes) -> bool:
    return False  # never read back as a trace


def load(path: str | os.PathLike[str]) -> NoReturn:
    from slogate.traces.formats import FormatError

    raise FormatError(f"{path}: parquet is an export format; read it with pandas, DuckDB or pyarrow")


def save(path: str | os.PathLike[str], header: TraceHeader, records: Sequence[RequestRecord]) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        from slogate.traces.formats import FormatError

        raise FormatError("--to parquet needs pyarrow: pip install 'slogate[parquet]'") from None
    data = columns(records)
    schema = pa.schema([(name, getattr(pa, "bool_" if kind == "bool" else kind)()) for name, kind in COLUMNS],
                       metadata={b"slogate.header": msgspec.json.encode(header)})
    table = pa.Table.from_pydict(data, schema=schema)
    pq.write_table(table, path)
    return len(records)
