"""The report's data model: what `replay.report` gathers from run and sweep directories and what
`replay.outputs.html` and `replay.report_plots` render. Structs and pure functions only: never reads
a file, never renders, and imports none of the three modules that use it.
"""

from __future__ import annotations

import msgspec

from slogate.replay import sweep as sweep_io
from slogate.replay.plan.vs_sweep import PlanVsSweep
from slogate.replay.results import Results
from slogate.replay.significance import Spread
from slogate.replay.stability import Stability
from slogate.traces.record import RequestRecord


class RunData(msgspec.Struct):
    """One run as the report sees it."""

    name: str
    path: str
    results: Results
    records: list[RequestRecord] = []  # from requests.jsonl.zst (empty when absent)
    scraped: list[dict[str, float]] = []  # from metrics.jsonl: {"t": seconds, metric: value, …}
    notes: list[str] = []  # what was missing or unreadable
    stability: Stability | None = None  # from stability.json (replay --stability)
    repeats: list[str] = []  # a `replay --repeat N` directory: its run directories (values are their means)
    spread: dict[str, Spread] = {}  # each metric's run-to-run spread over `repeats`
    telemetry_source: str | None = None  # where `scraped` came from (metrics.jsonl's `source`, else the scrape)


class SweepData(msgspec.Struct):
    """One sweep directory: its sweep.json (the points' runs are RunData entries of the report)."""

    name: str
    path: str
    sweep: sweep_io.Sweep
    planned: PlanVsSweep | None = None  # a plan.json given beside it: predicted vs measured (replay.plan.vs_sweep)


class Conclusion(msgspec.Struct):
    """One statement the numbers support, with the figure it rests on (`conclusions.json`)."""

    topic: str  # capacity, binding, cost, stability, trust
    text: str
    figure: str  # anchor id in report.html of the figure or table it rests on
    level: str = "info"  # info | warn
    run: str | None = None  # the run (or sweep) it is about
    values: dict[str, float | str | None] = {}


class ReportData(msgspec.Struct):
    """Everything one report shows."""

    title: str
    generated_unix: float
    runs: list[RunData]
    sweeps: list[SweepData] = []
    conclusions: list[Conclusion] = []
    # per run after the first: the CI of each metric's change vs the first run (replay.report_repeats:
    # the per-request bootstrap, widened by the run-to-run noise when runs have repeats; None: no records)
    cis: list[dict[str, tuple[float, float]] | None] = []


def anchor(kind: str, name: str) -> str:
    """An HTML id for a run's (or sweep's) figure: `kind-` + the name with unsafe characters as '-'."""
    return kind + "-" + "".join(c if c.isalnum() or c in "_." else "-" for c in name)


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


class LoadProfile(msgspec.Struct):
    """The shape of the load a run offered (its measured records; warm-up already excluded)."""

    requests: int = 0
    span_s: float = 0.0
    mean_rps: float | None = None
    interarrival_cv: float | None = None  # 1 ≈ Poisson, > 1 bursty, < 1 smoother than random
    peak_minute_rps: float | None = None  # busiest 60 s (the whole span when shorter)
    peak_minute_start_s: float | None = None
    arrivals_per_s: list[int] = []  # requests per 1 s bin from the first arrival
    input_tokens: list[int] = []  # per request (for the histograms)
    output_tokens: list[int] = []
    input_p50: float | None = None
    input_p99: float | None = None
    output_p50: float | None = None
    output_p99: float | None = None
    prefix_reuse: float | None = None  # share of prompt blocks already seen earlier
    sessions: int | None = None  # distinct session keys, when recorded


def load_profile(records: list[RequestRecord]) -> LoadProfile:
    """Arrival pattern, length distributions and prefix reuse, from `traces.stats` (the numbers
    `slogate trace stats` prints) plus the per-second arrivals and the peak minute."""
    from slogate.traces.stats import trace_stats

    if not records:
        return LoadProfile()
    recs = sorted(records, key=lambda r: r.t)
    st = trace_stats(recs)
    t0 = recs[0].t
    bins = [0] * (int(recs[-1].t - t0) + 1)
    for r in recs:
        bins[int(r.t - t0)] += 1
    window = min(60, len(bins))
    best, best_i, run_sum = -1, 0, 0
    for i, c in enumerate(bins):
        run_sum += c - (bins[i - window] if i >= window else 0)
        if i >= window - 1 and run_sum > best:
            best, best_i = run_sum, i - window + 1
    # shorter than a minute: the whole span is the busiest minute; arrivals all at one instant have no rate
    span_of_peak = window if window == 60 else st.duration_s
    sessions = {r.session for r in recs if r.session}
    return LoadProfile(
        requests=st.requests, span_s=st.duration_s, mean_rps=st.mean_rps, interarrival_cv=st.interarrival_cv,
        peak_minute_rps=best / span_of_peak if best >= 0 and span_of_peak > 0 else None,
        peak_minute_start_s=float(best_i),
        arrivals_per_s=bins, input_tokens=[r.input_tokens for r in recs if r.input_tokens is not None],
        output_tokens=[r.output_tokens for r in recs if r.output_tokens is not None],
        input_p50=st.input_tokens.p50, input_p99=st.input_tokens.p99, output_p50=st.output_tokens.p50,
        output_p99=st.output_tokens.p99, prefix_reuse=st.prefix_reuse, sessions=len(sessions) or None,
    )
