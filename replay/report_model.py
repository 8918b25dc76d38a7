"""The report's data model: what `replay.report` gathers from run and sweep directories and what
`replay.outputs.html` and `replay.report_plots` render. Structs and pure functions only: never reads
a file, never renders, and imports none of the three modules that use it.
"""

from __future__ import annotations

import msgspec

from slogate.replay import sweep as sweep_io
from slogate.replay.results import Results
from slogate.traces.record import RequestRecord


class RunData(msgspec.Struct):
    """One run as the report sees it."""

    name: str
    path: str
    results: Results
    records: list[RequestRecord] = []  # from requests.jsonl.zst (empty when absent)
    scraped: list[dict[str, float]] = []  # from metrics.jsonl: {"t": seconds, metric: value, …}
    notes: list[str] = []  # what was missing or unreadable


class SweepData(msgspec.Struct):
    """One sweep directory: its sweep.json (the points' runs are RunData entries of the report)."""

    name: str
    path: str
    sweep: sweep_io.Sweep


class ReportData(msgspec.Struct):
    """Everything one report shows."""

    title: str
    generated_unix: float
    runs: list[RunData]
    sweeps: list[SweepData] = []


def flatten_sample(obj: dict[str, object]) -> dict[str, float] | None:
    """One metrics.jsonl sample as {"t": seconds, name: value, …}: numeric values at the top level or
    one level down (`metrics`/`values`); None when it has no time."""
    t = next((obj[k] for k in ("t", "time", "ts", "elapsed_s") if isinstance(obj.get(k), int | float)), None)
    if t is None:
        return None
    out: dict[str, float] = {"t": float(t)}  # type: ignore[arg-type]
    for key, value in obj.items():
        if key in ("t", "time", "ts", "elapsed_s"):
            continue
        if isinstance(value, dict):
            for k2, v2 in value.items():
                if isinstance(v2, int | float) and not isinstance(v2, bool):
                    out[str(k2)] = float(v2)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out
