"""Public trace formats: guess a file's format, load it as slogate records, save records in a format.

One module per format (`slogate`, `mooncake`, `azure`, `burstgpt`, `agentic`; export-only tables `csv`
and `parquet`, in `table_csv` / `table_parquet`), each with `sniff`, `load` and (when exportable) `save`.
Pure file conversion: never touches the network, never sees prompt text.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError

FORMATS: tuple[str, ...] = ("slogate", "mooncake", "azure", "burstgpt", "agentic", "csv", "parquet")  # last two: export only
MULTI_FILE: frozenset[str] = frozenset({"slogate", "agentic"})  # formats read from several files at once
Loaded = tuple[TraceHeader, list[RequestRecord]]
PathLike = str | os.PathLike[str]
_SNIFF_BYTES = 4096
INPUT_FORMATS = tuple(f for f in FORMATS if f not in ("csv", "parquet"))
_MODULES = {"csv": "table_csv", "parquet": "table_parquet"}  # not `csv`: that would shadow the stdlib here


__all__ = ["FORMATS", "INPUT_FORMATS", "FormatError", "TraceError", "guess_format", "load", "module", "save"]


class FormatError(ValueError):
    """A format name or file the user got wrong (the message names it and the fix)."""


def module(fmt: str) -> ModuleType:
    """The module implementing format `fmt`."""
    if fmt not in FORMATS:
        raise FormatError(f"unknown trace format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return importlib.import_module(f"slogate.traces.formats.{_MODULES.get(fmt, fmt)}")


def guess_format(path: PathLike, *, for_output: bool = False) -> str:
    """Format of `path`: by content when the file exists (and not `for_output`), else by name."""
    p = Path(path)
    if not for_output and p.is_dir():
        names = [q.name for q in p.iterdir() if q.is_file()]
        agentic = any(n.endswith(".json") for n in names) and not any(n.endswith(".zst") for n in names)
        return "agentic" if agentic else "slogate"
    if not for_output and p.is_file():
        head = _head(p)
        for fmt in FORMATS:
            if module(fmt).sniff(head):
                return fmt
        raise FormatError(f"cannot tell the trace format of {path}: name it with --format FMT (replay, plan) or "
                          f"--from FMT (trace), one of {', '.join(INPUT_FORMATS)}")
    name = p.name.lower()
    for fmt in FORMATS:
        if name.endswith(module(fmt).SUFFIXES):
            return fmt
    raise FormatError(
        f"cannot tell the trace format from the name {path}: use a .jsonl.zst (slogate), .jsonl (mooncake) "
        f"or .csv (azure) name, or pass the format (--from/--to)"
    )


def _head(p: Path) -> bytes:
    """The first bytes of a file, decompressed when it is gzip (`.jsonl.gz`), without a byte-order mark."""
    import gzip

    with open(p, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if head[:2] == b"\x1f\x8b":
        with gzip.open(p, "rb") as g, contextlib.suppress(OSError, EOFError):
            head = g.read(_SNIFF_BYTES)
    return head.removeprefix(codecs.BOM_UTF8)  # a UTF-8 byte-order mark (Excel's CSVs): not content


def load(path: PathLike | Sequence[PathLike], fmt: str | None = None, *, block_size: int | None = None) -> Loaded:
    """Read a trace (several files only for slogate segments and agentic sessions) as (header,
    records in file order). `block_size`: tokens per hash id for formats that do not say (Mooncake)."""
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    if not paths:
        raise FormatError("no trace file given")
    for p in paths:
        if not os.path.exists(p):
            raise FormatError(f"no such trace file: {p}")
    fmt = fmt or guess_format(paths[0])
    if len(paths) > 1 and fmt not in MULTI_FILE:
        raise FormatError(f"only slogate segments and agentic sessions can be read together; load each {fmt} file on its own")
    mod = module(fmt)
    try:
        if block_size is not None and fmt == "mooncake":
            return mod.load(paths[0], block_size=block_size)
        return mod.load(paths if fmt in MULTI_FILE else paths[0])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(paths[0], f"cannot read as {fmt}: {exc}; check the file or pass another --from") from None
    except OSError as exc:
        raise TraceError(paths[0], f"cannot read: {exc.strerror or exc}") from None


def save(
    records: Sequence[RequestRecord],
    path: PathLike,
    fmt: str | None = None,
    *,
    header: TraceHeader | None = None,
    **options: object,
) -> int:
    """Write `records` to `path` in `fmt` (guessed from the name when None); returns records written."""
    fmt = fmt or guess_format(path, for_output=True)
    mod = module(fmt)
    if not hasattr(mod, "save"):
        raise FormatError(f"export to {fmt} is not supported: choose slogate, mooncake, azure, csv or parquet")
    return int(mod.save(path, header or TraceHeader(), records, **options))
