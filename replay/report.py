"""`slogate report`: gather what one or more run (or sweep) directories hold and write one
self-contained HTML file plus `conclusions.json` beside it (replay.outputs.html renders it,
replay.report_plots draws the plots, replay.report_conclusions writes the conclusions; the data
they share is replay.report_model).

Reads results.json, requests.jsonl.zst, metrics.jsonl, stability.json, sweep.json and `replay --repeat`
directories (repeats.json, replay.report_repeats); never fetches anything remote and never needs matplotlib (without it the report has every table and says how to get plots).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.replay import report_repeats, report_sessions
from slogate.replay import results as results_io
from slogate.replay import sweep as sweep_io
from slogate.replay.compare import CompareError, summarize_trace
from slogate.replay.names import number_repeated_names
from slogate.replay.plan import output as plan_output
from slogate.replay.plan import vs_sweep
from slogate.replay.repeats import Repeated, noise
from slogate.replay.report_conclusions import conclude
from slogate.replay.report_model import ReportData, RunData, SweepData, flatten_sample
from slogate.replay.significance import DEFAULT_RESAMPLES
from slogate.replay.stability import Stability
from slogate.traces.segments import TraceError

PLOTS_HINT = "plots need matplotlib: pip install slogate[report]"
MAX_TIMELINES = 6  # timelines drawn (one figure per run); more runs are listed, not drawn
MAX_CI_RUNS = 6  # bootstrap CIs vs the first run for reports of at most this many runs
CI_RESAMPLES = DEFAULT_RESAMPLES  # compare's default: the report's intervals are `slogate compare`'s, to the digit


class ReportError(ValueError):
    """A user mistake (missing directory, no results.json): names the path and the fix."""


def collect(paths: Sequence[str | Path], *, with_records: bool = True) -> ReportData:
    """Read every run directory (or results.json, or sweep directory) named on the command line."""
    runs: list[RunData] = []
    reps: dict[int, Repeated] = {}  # id(run) -> its repeats, for the change intervals
    sweeps: list[SweepData] = []
    names: list[str] = []  # what was named on the command line, for the title
    plans = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise ReportError(f"{p}: no such file or directory (give a run directory holding results.json, a sweep "
                              "directory or a captured trace)")
        if (p.is_dir() and (p / "plan.json").is_file() and not (p / "results.json").is_file()) or p.name == "plan.json":
            plans.append(_load(plan_output.load, p, "plan.json"))  # shown beside the sweeps (plan vs measurement)
        elif p.is_dir() and (p / "sweep.json").is_file():
            sweep = _load(sweep_io.load, p / "sweep.json", "sweep.json")
            sweeps.append(SweepData(name=p.name, path=str(p), sweep=sweep))
            names.append(f"sweep {p.name}")
            for point in sweep.points:
                runs.append(load_run(p / point.dir, name=f"{p.name} {sweep.mode}={point.x:g}", with_records=with_records))
        elif report_repeats.is_repeats_dir(p):
            runs.append(load_repeated(p, reps, with_records=with_records))
            names.append(f"{runs[-1].name} ×{len(runs[-1].repeats)}")
        else:
            runs.append(load_run(p, with_records=with_records))
            names.append(runs[-1].name)
    if not runs:
        raise ReportError("nothing to report: give at least one run directory")
    for sw in sweeps:
        row = next((r for plan in plans if (r := vs_sweep.find_candidate(plan, sw.sweep)) is not None), None)
        if row is not None:
            sw.planned = vs_sweep.compare(next(pl for pl in plans if row in pl.candidates), sw.sweep, row)
    number_repeated_names(runs)
    data = ReportData(title="slogate report: " + ", ".join(names), generated_unix=time.time(), runs=runs, sweeps=sweeps)
    if 1 < len(runs) <= MAX_CI_RUNS:
        sides = [reps.get(id(r)) or report_repeats.single(r) for r in runs]
        data.cis = report_repeats.change_intervals(sides, seed=0, resamples=CI_RESAMPLES)
    data.conclusions = conclude(data)
    return data


def load_run(path: str | Path, *, name: str | None = None, with_records: bool = True) -> RunData:
    p = Path(path)
    directory = p if p.is_dir() else p.parent
    results_file = p / "results.json" if p.is_dir() else p
    if _is_trace(p):
        return load_capture(p, name=name, with_records=with_records)
    if not results_file.is_file():
        raise ReportError(f"{results_file}: missing (run `slogate replay … --out {directory}` first)")
    results = _load(results_io.load, results_file, "results.json")
    label = name or (directory.name if results_file.name == "results.json" else results_file.stem)
    run = RunData(name=label, path=str(directory), results=results)
    if with_records:
        _read_records(run, directory / "requests.jsonl.zst")
    _read_scraped(run, directory / "metrics.jsonl")
    if (directory / "stability.json").is_file():
        try:
            run.stability = msgspec.json.decode((directory / "stability.json").read_bytes(), type=Stability)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            run.notes.append(f"stability.json unreadable ({exc})")
    return run


def _is_trace(p: Path) -> bool:
    """A slogate trace: one .jsonl.zst file, or a gateway capture directory (its .jsonl.zst segments and no
    results.json: a run directory holds its requests file too)."""
    if p.is_dir():
        return not (p / "results.json").is_file() and any(q.name.endswith(".jsonl.zst") for q in p.iterdir())
    return p.name.endswith(".jsonl.zst")


def load_capture(path: Path, *, name: str | None = None, with_records: bool = True) -> RunData:
    """A captured trace as a run: summarized as `slogate compare` summarizes one (production beside the
    candidates), with the SLOs its header records."""
    try:
        results, records = summarize_trace(path, with_records=True)
    except CompareError as exc:
        raise ReportError(str(exc)) from None
    run = RunData(name=name or (path.name if path.is_dir() else path.name.removesuffix(".jsonl.zst")),
                  path=str(path), results=results, records=records if with_records else [])
    run.notes.append("a captured trace, summarized like a run over its offered window (no replay: no schedule lag, telemetry or stability)")
    return run


def load_repeated(path: Path, reps: dict[int, Repeated], *, with_records: bool = True) -> RunData:
    """A `replay --repeat N` directory as one run: the repeats' mean summary and spread; its records,
    telemetry and stability (the figures) are the first repeat's."""
    try:
        rep, dirs = report_repeats.load_repeats(path)
    except report_repeats.RepeatsError as exc:
        raise ReportError(str(exc)) from None
    run = load_run(dirs[0], name=path.name, with_records=with_records)
    run.path, run.results = str(path), rep.side.results
    run.repeats = [d.name for d in dirs]
    run.spread = noise(rep)
    run.notes.append(f"the values are the means of {len(dirs)} repeats ({', '.join(run.repeats)}); the load, CDF and "
                     f"timeline figures show {dirs[0].name}")
    if run.spread and all(sp.sd == 0 for sp in run.spread.values()):
        run.notes.append("the repeats are identical (virtual time with one sim seed?): no run-to-run noise was "
                         "measured, so the intervals are the bootstrap's alone")
    reps[id(run)] = rep
    return run


def _load(loader, path: Path, what: str):  # type: ignore[no-untyped-def]
    try:
        return loader(path)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ReportError(f"{path}: not a slogate {what} ({exc})") from None


def _read_records(run: RunData, path: Path) -> None:
    if not path.is_file():
        run.notes.append(f"{path.name} not found: CDFs and timeline omitted for this run")
        return
    from slogate.traces.reader import read_trace

    try:
        run.records = read_trace(path).records
    except TraceError as exc:
        run.notes.append(f"{path.name} unreadable ({exc}): CDFs and timeline omitted")


def _read_scraped(run: RunData, path: Path) -> None:
    samples, note = read_samples(path)
    run.scraped = samples
    if samples:
        run.telemetry_source = samples_source(path)
    if note:
        run.notes.append(note)


def samples_source(path: Path) -> str:
    """Where metrics.jsonl's samples came from: its first line's `source` (replay.virtual_samples writes
    "sim-virtual"), else the target's /metrics scraped over HTTP ("scrape")."""
    with path.open("rb") as f:
        first = f.readline()
    try:
        obj = msgspec.json.decode(first)
    except msgspec.DecodeError:
        return "scrape"
    source = obj.get("source") if isinstance(obj, dict) else None
    return source if isinstance(source, str) and source else "scrape"


def read_samples(path: Path) -> tuple[list[dict[str, float]], str | None]:
    """metrics.jsonl: one JSON object per sample with a time (`t`, seconds from the run start) and
    numeric values, either top-level or under `metrics`/`values`. Non-numeric fields are ignored.
    Returns the samples and a note when the file holds none (no file: no samples, no note)."""
    if not path.is_file():
        return [], None
    samples: list[dict[str, float]] = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            obj = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(obj, dict):
            sample = flatten_sample(obj)
            if sample is not None:
                samples.append(sample)
    return samples, None if samples else "metrics.jsonl holds no usable samples"


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def build_html(data: ReportData, *, plots: bool = True) -> str:
    """The whole report as one HTML string. `plots=False` (or no matplotlib) gives tables only."""
    from slogate.replay.outputs import html

    images: dict[str, str | None] = {}
    note: str | None = None
    if plots and plots_available():
        from slogate.replay import report_plots

        images = report_plots.draw_all(data, max_timelines=MAX_TIMELINES)
        images.update(report_sessions.draw(data, max_runs=MAX_TIMELINES))
    elif plots:
        note = PLOTS_HINT
    else:
        note = "plots disabled (--no-plots)"
    return html.render(data, images, plots_note=note)


def write_report(paths: Sequence[str | Path], out: str | Path, *, plots: bool = True) -> Path:
    """report.html (or `out`) and its JSON twin `conclusions.json` in the same directory."""
    data = collect(paths)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(build_html(data, plots=plots), encoding="utf-8")
    twin = {"report": target.name, "title": data.title, "generated_unix": data.generated_unix,
            "conclusions": [msgspec.to_builtins(c) for c in data.conclusions]}
    (target.parent / "conclusions.json").write_bytes(msgspec.json.format(msgspec.json.encode(twin), indent=2) + b"\n")
    return target
