"""The flat column layout of a record for table exports (CSV, Parquet): one row per request.

Shared by `formats.table_csv` and `formats.table_parquet` so both carry the same columns with the same meaning
(the record's fields; `error` is the ErrorClass, `t` seconds from the trace start). Never prompt text.
"""

from __future__ import annotations

from collections.abc import Sequence

from slogate.traces.record import RequestRecord, error_class

# (column, type) in order; types name the Arrow type used by the Parquet export.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("t", "float64"), ("endpoint", "string"), ("model", "string"), ("stream", "bool"),
    ("input_tokens", "int64"), ("output_tokens", "int64"), ("max_tokens", "int64"), ("cached_tokens", "int64"),
    ("ttft", "float64"), ("tpot", "float64"), ("e2e", "float64"), ("ttfb", "float64"), ("queue", "float64"),
    ("lag", "float64"), ("status", "int64"), ("finish_reason", "string"), ("error", "string"),
    ("upstream", "string"), ("pool", "string"), ("session", "string"), ("n_hash_ids", "int64"),
)
NAMES = tuple(name for name, _ in COLUMNS)


def row(r: RequestRecord) -> tuple:
    values = []
    for name in NAMES:
        if name == "error":
            values.append(error_class(r))
        elif name == "n_hash_ids":
            values.append(len(r.hash_ids) if r.hash_ids is not None else None)
        else:
            values.append(getattr(r, name))
    return tuple(values)


def columns(records: Sequence[RequestRecord]) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in NAMES}
    for r in records:
        for name, value in zip(NAMES, row(r), strict=True):
            out[name].append(value)
    return out
