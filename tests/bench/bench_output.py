"""What every benchmark in tests/bench/ prints and writes: a plain-text table and a JSON results file.

Imported by the bench scripts as a sibling module (they run as `.venv/bin/python tests/bench/X.py`,
so this folder is on `sys.path`). Formatting and file writing only; never measures anything.
"""

from __future__ import annotations

import json
from pathlib import Path


def aligned_rows(rows: list[list[str]]) -> list[str]:
    """Rows of cells (the header first) as lines: each column left-aligned to its widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]


def save_json(path: Path, data: object) -> None:
    """Write `data` as indented JSON (ending in a newline), creating the results folder when missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
