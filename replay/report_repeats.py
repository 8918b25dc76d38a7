"""The report's repeated runs and differences: a `replay --repeat N` directory (run-K, repeats.json) is one
run of the repeats' means and spread, and every change vs the first run gets `compare --repeat`'s interval
(replay.compare.intervals widened by replay.repeats.widen). Never tests significance itself, never plots.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from slogate.replay.compare import CompareError, Side, deltas, flatten, intervals, load_side
from slogate.replay.repeats import HEADLINE, Intervals, Repeated, combine, widen
from slogate.replay.significance import significant

if TYPE_CHECKING:
    from slogate.replay.report_model import ReportData, RunData

REPEATS_FILE = "repeats.json"


class RepeatsError(ValueError):
    """A repeats directory that cannot be read: names the path and the fix."""


class RepeatsFile(msgspec.Struct):
    """The part of repeats.json the report needs (replay.cli.replay.run_repeats writes it)."""

    n: int
    runs: list[str]


def is_repeats_dir(p: Path) -> bool:
    return p.is_dir() and (p / REPEATS_FILE).is_file() and not (p / "results.json").is_file()


def load_repeats(p: Path) -> tuple[Repeated, list[Path]]:
    """The repeats of a `replay --repeat N` directory as one side (mean summary, pooled records) and the
    run directories, in order."""
    try:
        spec = msgspec.json.decode((p / REPEATS_FILE).read_bytes(), type=RepeatsFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RepeatsError(f"{p / REPEATS_FILE}: not a slogate repeats.json ({exc})") from None
    dirs = [p / name for name in spec.runs]
    missing = [d for d in dirs if not (d / "results.json").is_file()]
    if missing or len(dirs) < 2:
        what = f"{missing[0]}/results.json is missing" if missing else "it lists fewer than 2 runs"
        raise RepeatsError(f"{p}: {what} (re-run `slogate replay … --repeat N --out {p}`)")
    try:
        sides = [load_side(d, name=d.name) for d in dirs]
    except CompareError as exc:
        raise RepeatsError(str(exc)) from None
    rep = combine(sides)
    rep.side.name, rep.side.source = p.name, str(p)
    return rep, dirs


def single(run: RunData) -> Repeated:
    """A plain run as a side with one repeat (no run-to-run interval: the bootstrap alone)."""
    side = Side(name=run.name, source=run.path, kind="run", results=run.results, records=run.records or None)
    return Repeated(side=side, repeats=[side])


def change_intervals(reps: Sequence[Repeated], *, seed: int = 0, resamples: int | None = None
                     ) -> list[Intervals | None]:
    """Per run after the first: each metric's change interval, as `slogate compare` (with `--repeat`
    when any run has repeats) computes it."""
    cis = intervals([r.side for r in reps], seed=seed, resamples=resamples)
    if any(len(r.repeats) > 1 for r in reps):
        return widen(reps, cis)
    return cis


class Difference(msgspec.Struct):
    """One metric's change of a run against the first run, and whether it exceeds the noise."""

    metric: str
    base: float | None
    value: float | None
    relative: float | None
    ci: tuple[float, float] | None  # of the absolute change
    ci_relative: tuple[float, float] | None
    significant: bool | None


def differences(data: ReportData, i: int, rows: Sequence[str] = HEADLINE) -> list[Difference]:
    """Run `i` (≥ 1) against the first run over `rows`; significance from `data.cis`."""
    base = flatten(data.runs[0].results.summary)
    flat = flatten(data.runs[i].results.summary)
    cis = (data.cis[i - 1] or {}) if len(data.cis) >= i else {}
    out = []
    for metric in rows:
        b, v = base.get(metric), flat.get(metric)
        if b is None and v is None:
            continue
        _, rel = deltas(b, v)
        ci = cis.get(metric)
        ci_rel = (ci[0] / abs(b), ci[1] / abs(b)) if ci is not None and b else None
        out.append(Difference(metric, b, v, rel, ci, ci_rel, significant(ci)))
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:+.1f} %"


def _num(metric: str, x: float | None) -> str:
    if x is None:
        return "–"
    if metric.endswith(("_s.p50", "_s.p90", "_s.p99", "_s.mean", "_s.max")):
        return f"{x * 1e3:.4g} ms"
    return f"{x:.1%}" if metric == "slo_attainment" else f"{x:.4g}"


def _spread_cell(run: RunData, metric: str, value: float | None) -> str:
    sp = run.spread.get(metric)
    if sp is None:
        return html.escape(_num(metric, value))
    cv = "" if sp.cv is None else f" (CV {sp.cv * 100:.1f} %)"
    return html.escape(f"{_num(metric, sp.mean)} ± {_num(metric, sp.sd).removesuffix(' ms')}{cv}")


def differences_html(data: ReportData) -> str:
    """`#differences`: per run after the first, each headline metric's change, its 95 % interval and the
    verdict; `#spread`: each repeated run's values as mean ± sd over its repeats."""
    from slogate.replay.report_model import anchor

    parts = []
    repeated = [r for r in data.runs if r.repeats]
    if repeated:
        rows = []
        for r in repeated:
            rows.append([f'<span id="{anchor("spread", r.name)}">{html.escape(r.name)}</span>', str(len(r.repeats))]
                        + [_spread_cell(r, m, flatten(r.results.summary).get(m)) for m in HEADLINE])
        head = "".join(f"<th>{html.escape(m)}</th>" for m in ("run", "repeats", *HEADLINE))
        parts.append('<div id="spread"><h3>Run-to-run spread</h3><p class="meta">runs given as a <code>replay --repeat N</code> '
                     "directory: every value in this report is the mean of the repeats; here ± is their standard "
                     "deviation (CV = sd / mean)</p><div class=\"wrap\"><table><thead><tr>" + head + "</tr></thead><tbody>"
                     + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
                     + "</tbody></table></div></div>")
    if len(data.runs) > 1 and any(data.cis):
        rows = []
        for i, r in enumerate(data.runs[1:], start=1):
            for d in differences(data, i):
                verdict = ("–" if d.significant is None else
                           '<b>significant</b>' if d.significant else "within the noise")
                ci = "–" if d.ci_relative is None else f"{_pct(d.ci_relative[0])} … {_pct(d.ci_relative[1])}"
                rows.append([html.escape(r.name), html.escape(d.metric), html.escape(_num(d.metric, d.base)),
                             html.escape(_num(d.metric, d.value)), _pct(d.relative), ci, verdict])
        head = "".join(f"<th>{h}</th>" for h in ("run", "metric", html.escape(data.runs[0].name) + " (baseline)",
                                                   "value", "change", "95 % CI of the change", "verdict"))
        how = ("with repeats the interval is the hull of the pooled-records bootstrap and the Welch interval of the "
               "repeats' values (as <code>slogate compare --repeat N</code>), so it counts run-to-run noise"
               if repeated else "a seeded bootstrap of the per-request records; give <code>replay --repeat N</code> directories "
               "to count run-to-run noise too (throughput rows need them)")
        parts.append('<div id="differences"><h3>Differences against the first run</h3><p class="meta">a change is '
                     f"significant when its 95 % interval excludes 0; {how}</p>"
                     '<div class="wrap"><table><thead><tr>' + head + "</tr></thead><tbody>"
                     + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
                     + "</tbody></table></div></div>")
    return "".join(parts)
