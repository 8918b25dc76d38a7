"""`DIR/summary.csv`: one header row and one row per run, every summary figure flattened
(`ttft_s.p99`, `goodput_rps`, …) plus the environment labels. Formatting only.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import msgspec

from slogate.replay.results import Results


def flatten(results: Results) -> dict[str, Any]:
    row: dict[str, Any] = {"target": results.environment.target}
    for k, v in sorted(results.environment.labels.items()):
        row[f"label.{k}"] = v
    for key, value in msgspec.to_builtins(results.summary).items():
        if isinstance(value, dict):
            for sub, x in value.items():
                if isinstance(x, dict):
                    for k2, x2 in x.items():
                        row[f"{key}.{sub}.{k2}"] = x2
                else:
                    row[f"{key}.{sub}"] = x
        elif isinstance(value, list):
            row[key] = "; ".join(map(str, value))
        else:
            row[key] = value
    return row


def write(results: Results, directory: str | Path) -> Path:
    path = Path(directory) / "summary.csv"
    row = flatten(results)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    return path
