"""The HTML output format: one self-contained page (inline CSS, plots as inline data: URIs).

Renders a `replay.report_model.ReportData` plus already-drawn images; never references a remote asset
(no CDN, fonts or scripts) and never computes metrics (they come from results.json / sweep.json).
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from slogate.replay.compare import better_direction, deltas, flatten, table_metrics

if TYPE_CHECKING:
    from slogate.replay.report_model import ReportData, SweepData

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1240px;
color:#1d2430;padding:0 16px;line-height:1.4}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.2em;border-bottom:2px solid #d0d7e2;padding-bottom:3px;margin-top:32px}
h3{font-size:1.02em;margin:18px 0 6px}
.how{color:#555;font-size:.9em;margin:2px 0 10px;font-style:italic}
.meta{color:#666;font-size:.88em}
table{border-collapse:collapse;font-size:.85em;margin:6px 0 10px}
th,td{border:1px solid #d9dee7;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#eef2f7}td.k,th.k{text-align:left;font-family:ui-monospace,Menlo,Consolas,monospace}
#environment td{text-align:left;max-width:340px;overflow-wrap:anywhere}.wrap{overflow-x:auto;max-width:100%}
tr:nth-child(even) td{background:#fafbfd}
.d{color:#888;font-size:.85em;margin-left:4px}.up{color:#1a7f37}.down{color:#c62828}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:6px 10px;margin:8px 0}
.note{background:#eef5ff;border-left:4px solid #4a80d0;padding:6px 10px;margin:8px 0}
img{max-width:100%;height:auto;border:1px solid #e3e7ee;margin:4px 0}
nav a{margin-right:14px}
"""

ENV_FIELDS = (
    ("target", "target"), ("server_kind", "server kind"), ("models", "models (/v1/models)"),
    ("server_version", "server version"), ("clock", "clock"), ("workload", "workload"),
    ("labels", "labels"), ("trace", "trace"), ("trace_digest", "trace digest"), ("seed", "seed"),
    ("endpoint", "endpoint"), ("stream", "stream"), ("output_forcing", "output length forcing"),
    ("tokenizer", "tokenizer"), ("slo", "SLO"), ("shard", "shard"), ("slogate_version", "slogate version"),
    ("workers", "sending processes"), ("start_unix", "started (UTC)"), ("command", "command line"),
)
SECTIONS = (
    ("environment", "Environment", "Where and how each run happened: compare these before comparing numbers."),
    ("summary", "Summary", "One column per run; latencies in ms; the small figure after a value is its change vs "
     "the first run (green better, red worse). Goodput counts only requests that met the SLO."),
    ("cdf", "Latency distributions (CDF)", "Fraction of successful requests at or below each latency: further left "
     "is faster; the p99 is where a line crosses the dotted 0.99 level (log x axis)."),
    ("timeline", "Timeline", "Per run over time: requests sent and completed per second, requests in flight, and "
     "TTFT/E2E p50 and p99 per time bin. Rising in-flight with flat completions means the target is saturated."),
    ("sweep", "Sweep: throughput–latency curve", "Each point is one run at a higher load; the curve bends up at the "
     "knee (★), after which extra load buys latency, not throughput. The red line is the SLO bound."),
)


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def render(data: ReportData, images: dict[str, str | None], *, plots_note: str | None = None) -> str:
    body = [f"<h1>{esc(data.title)}</h1>",
            f'<p class="meta">generated {esc(_utc(data.generated_unix))} by slogate · {len(data.runs)} run(s)</p>',
            "<nav>" + "".join(f'<a href="#{sid}">{esc(title.split(":")[0])}</a>' for sid, title, _ in SECTIONS) + "</nav>"]
    if plots_note:
        body.append(f'<p class="note" id="plots-note">{esc(plots_note)}</p>')
    builders = {"environment": _environment, "summary": _summary, "cdf": _cdf, "timeline": _timeline, "sweep": _sweep}
    order = list(SECTIONS)
    if data.sweeps:  # a sweep's curve is its headline: right after the summary
        order.insert(2, order.pop(-1))
    for sid, title, how in order:
        inner = builders[sid](data, images, plots_note)
        body.append(f'<section id="{sid}"><h2>{esc(title)}</h2><p class="how">How to read this: {esc(how)}</p>{inner}</section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(data.title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "–"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, key_col: bool = True) -> str:
    """Cells are already-escaped HTML."""
    head = "".join(f'<th class="k">{h}</th>' if i == 0 and key_col else f"<th>{h}</th>" for i, h in enumerate(header))
    lines = ['<div class="wrap"><table><thead><tr>' + head + "</tr></thead><tbody>"]
    for row in rows:
        lines.append("<tr>" + "".join(f'<td class="k">{c}</td>' if i == 0 and key_col else f"<td>{c}</td>"
                                      for i, c in enumerate(row)) + "</tr>")
    lines.append("</tbody></table></div>")
    return "".join(lines)


def _env_value(key: str, value: object) -> str:
    if value is None or value == [] or value == {}:
        return "–"
    if key == "start_unix":
        return esc(_utc(float(value)))  # type: ignore[arg-type]
    if isinstance(value, dict):
        return esc(", ".join(f"{k}={v}" for k, v in value.items()))
    if isinstance(value, list):
        return esc(" ".join(str(v) for v in value)) if key in ("command", "workload") else esc(", ".join(map(str, value)))
    return esc(value)


def _environment(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    rows = []
    for key, label in ENV_FIELDS:
        values = [getattr(r.results.environment, key, None) for r in data.runs]
        if all(v in (None, "", [], {}, 0.0) for v in values) and key not in ("target", "labels"):
            continue
        rows.append([esc(label)] + [_env_value(key, v) for v in values])
    return _table(["field"] + [esc(r.name) for r in data.runs], rows)


def fmt(metric: str, x: float | None) -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "∞"
    if _is_latency(metric):
        x *= 1e3
    if x == int(x) and abs(x) < 1e12:
        return f"{int(x)}"
    return f"{x:.4g}"


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.4g}"


def _is_latency(metric: str) -> bool:
    head, _, stat = metric.partition(".")
    return head.endswith("_s") and stat not in ("", "count") and head != "duration_s"


def _summary(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    flats = [flatten(r.results.summary) for r in data.runs]
    rows = []
    for metric in table_metrics(flats):
        cells = [esc(metric), "ms" if _is_latency(metric) else ""]
        base = flats[0].get(metric)
        for i, flat in enumerate(flats):
            value = flat.get(metric)
            cell = esc(fmt(metric, value))
            if i > 0:
                _, rel = deltas(base, value)
                direction = better_direction(metric)
                if rel is not None and rel != 0 and not math.isinf(rel):
                    cls = "" if not direction else "up" if (rel > 0) == (direction > 0) else "down"
                    cell += f'<span class="d {cls}">{rel * 100:+.1f}%</span>'
            cells.append(cell)
        rows.append(cells)
    warn = "".join(f'<p class="warn">{esc(r.name)} is DEGRADED: {esc("; ".join(r.results.summary.degraded_reasons))}</p>'
                   for r in data.runs if r.results.summary.degraded)
    notes = "".join(f'<p class="note">{esc(r.name)}: {esc(n)}</p>' for r in data.runs for n in r.notes)
    return warn + _table(["metric", "unit"] + [esc(r.name) for r in data.runs], rows) + notes


def _image(src: str | None, alt: str, note: str | None) -> str:
    if src:
        return f'<img src="{src}" alt="{esc(alt)}">'
    return f'<p class="note">{esc(note or "no per-request data to plot (requests.jsonl.zst missing or empty)")}</p>'


def _cdf(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    rows = []
    for r in data.runs:
        s = r.results.summary
        rows.append([esc(r.name)] + [esc(fmt(f"{m}.{q}", getattr(getattr(s, m), q)))
                                     for m in ("ttft_s", "tpot_s", "e2e_s") for q in ("p50", "p90", "p99")])
    header = ["run"] + [f"{m.split('_')[0].upper()} {q} (ms)" for m in ("ttft_s", "tpot_s", "e2e_s") for q in ("p50", "p90", "p99")]
    return _image(images.get("cdf"), "TTFT, TPOT and E2E CDFs", note) + _table(header, rows)


def _timeline(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    parts = []
    for r in data.runs:
        key = f"timeline:{r.name}"
        if key in images or note:
            parts.append(f"<h3>{esc(r.name)}</h3>" + _image(images.get(key), f"timeline of {r.name}", note))
    drawn = sum(1 for k in images if k.startswith("timeline:"))
    if not note and drawn < len(data.runs):
        parts.append(f'<p class="note">timelines drawn for the first {drawn} of {len(data.runs)} runs</p>')
    if any(r.scraped for r in data.runs):
        parts.append('<p class="meta">the last panel shows the target\'s own metrics scraped during the run (metrics.jsonl)</p>')
    return "".join(parts) or '<p class="note">no runs</p>'


def _sweep(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    if not data.sweeps:
        return '<p class="note">No sweep in this report (give a `slogate sweep` output directory for the curve).</p>'
    return "".join(_one_sweep(sw, images, note) for sw in data.sweeps)


def _one_sweep(sw: SweepData, images: dict[str, str | None], note: str | None) -> str:
    s = sw.sweep
    knee = f"{s.mode} {s.knee:g}" if s.knee is not None else "not reached in the measured range"
    best = f"{s.mode} {s.max_x_meeting_slo:g}" if s.max_x_meeting_slo is not None else "none (the lowest point already misses it)"
    facts = (f'<p id="sweep-facts-{esc(sw.name)}"><b>knee:</b> {esc(knee)} · <b>largest {esc(s.mode)} with SLO attainment ≥ '
             f"{s.attainment_target:.0%}:</b> {esc(best)} · <b>SLO:</b> {esc(s.slo or '–')}</p>"
             f'<p class="meta">{esc(s.knee_rule)}</p>')
    header = [esc(s.mode), "offered req/s", "req/s", "output tok/s", "goodput req/s", "attainment",
              "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)", "failed", "note"]
    rows = []
    for p in s.points:
        mark = []
        if p.x == s.knee:
            mark.append("★ knee")
        if p.x == s.max_x_meeting_slo:
            mark.append("max meeting SLO")
        if p.refined:
            mark.append("refined")
        if p.degraded:
            mark.append("degraded")
        rows.append([f"{p.x:g}", fmt("", p.offered_rate_rps), fmt("", p.request_rate_rps), fmt("", p.output_tokens_per_s),
                     fmt("", p.goodput_rps), "–" if p.slo_attainment is None else f"{p.slo_attainment:.1%}",
                     ms(p.ttft_p50_s), ms(p.ttft_p99_s), ms(p.tpot_p50_s), ms(p.tpot_p99_s), str(p.failed),
                     esc(", ".join(mark))])
    return (f"<h3>{esc(sw.name)}</h3>" + facts + _image(images.get(f"sweep:{sw.name}"), f"sweep curve of {sw.name}", note)
            + _table(header, rows))
