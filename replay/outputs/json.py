"""`DIR/results.json`: the versioned Results document (schema in replay/results.py).

Writes only; never computes a number and never sees an API key (the environment is redacted).
"""

from __future__ import annotations

from pathlib import Path

from slogate.replay.results import Results, dump


def write(results: Results, directory: str | Path) -> Path:
    path = Path(directory) / "results.json"
    dump(results, path)
    return path
