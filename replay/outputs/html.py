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
from slogate.replay.plan.vs_sweep import lines as vs_sweep_lines
from slogate.replay.report_repeats import differences_html
from slogate.replay.report_sessions import sessions_html

if TYPE_CHECKING:
    from slogate.replay.report_model import ReportData, RunData, SweepData

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1240px;
color:#1d2430;padding:0 16px;line-height:1.4}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.25em;border-bottom:2px solid #d0d7e2;padding-bottom:3px;margin-top:32px}
h3{font-size:1.02em;margin:18px 0 6px}
.how{color:#555;font-size:.9em;margin:2px 0 10px;font-style:italic}
.meta{color:#666;font-size:.88em}
table{border-collapse:collapse;font-size:.85em;margin:6px 0 10px}
th,td{border:1px solid #d9dee7;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#eef2f7}td.k,th.k{text-align:left;font-family:ui-monospace,Menlo,Consolas,monospace}
#environment td{text-align:left;max-width:340px;overflow-wrap:anywhere}.wrap{overflow-x:auto;max-width:100%}
tr:nth-child(even) td{background:#fafbfd}
.d{color:#888;font-size:.85em;margin-left:4px}.up{color:#1a7f37}.down{color:#c62828}.sig{font-weight:bold}
.nr{color:#a0a6b0;font-style:italic}.src{color:#8a93a0;font-size:.8em;margin-left:4px}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:6px 10px;margin:8px 0}
.note{background:#eef5ff;border-left:4px solid #4a80d0;padding:6px 10px;margin:8px 0}
ul.concl{padding-left:0;list-style:none}ul.concl li{margin:6px 0;padding:6px 10px;border-left:4px solid #4a80d0;background:#f5f8fd}
ul.concl li.warn{border-left-color:#f0a020;background:#fff8ee}.topic{font-weight:600;text-transform:uppercase;font-size:.78em;
color:#556;margin-right:6px}
details{margin:8px 0}summary{cursor:pointer;color:#2a5db0}
img{max-width:100%;height:auto;border:1px solid #e3e7ee;margin:4px 0}
nav a{margin-right:14px}
@media (max-width:700px){body{margin:8px auto;padding:0 8px;font-size:15px}table{font-size:.78em}
th,td{padding:2px 4px}h1{font-size:1.2em}nav a{display:inline-block;margin:2px 10px 2px 0}}
@media print{nav,.how{display:none}body{max-width:none;margin:0;color:#000}section{break-inside:auto}
img,table,li{break-inside:avoid}a{color:#000;text-decoration:none}h2{break-after:avoid}details>summary{display:none}}
"""

SECTIONS = (
    ("environment", "Environment", "Where and how each run happened, so the setup can be rebuilt: hardware, engine, "
     "model, client settings. The small grey text says who stated a value (the server, the sim's config or a "
     "--label); \u201cnot recorded\u201d means nobody did. Compare these before comparing numbers."),
    ("load", "Load", "What was offered to the server: arrivals over time (burstiness CV 1 \u2248 Poisson, > 1 bursty), "
     "the busiest minute, prompt and output length distributions and prefix reuse. Warm-up requests are excluded "
     "everywhere; the workload line says how the trace was transformed."),
    ("metrics", "Metrics", "Throughput beside goodput (only requests that met the SLO), latency percentiles in ms "
     "(after the first run: change vs it; bold * = beyond the 95 % CI of the change, ~ = within the noise; the "
     "differences table gives each interval, and a `replay --repeat N` directory adds the run-to-run spread), failures by class, the throughput\u2013latency curve and the server's own telemetry. Every other field "
     "is folded under \u201call summary metrics\u201d."),
    ("conclusions", "Conclusions", "Written by rules from the numbers above (capacity with headroom, what binds, "
     "cost, stability, trust); each links to the figure it rests on. conclusions.json beside this file holds the same."),
)
ENV_ROWS = (  # (label, getter name) in reading order; "engine.X" reads env.engine[X]
    ("hardware", (("GPU", "gpu"), ("GPU count", "gpu_count"), ("GPU memory", "gpu_memory"), ("driver", "driver"),
                  ("CUDA", "cuda"))),
    ("engine", (("framework", "framework"), ("framework version", "framework_version"), ("server kind", "server_kind"),
                ("model", "models"), ("precision", "precision"), ("max_num_seqs", "engine.max_num_seqs"),
                ("token budget (max_num_batched_tokens)", "engine.max_num_batched_tokens"),
                ("tensor parallel", "engine.tp"), ("prefix caching", "engine.prefix_caching"),
                ("other engine flags", "engine.*"))),
    ("client", (("slogate version", "slogate_version"), ("target", "target"), ("endpoint", "endpoint"),
                ("stream", "stream"), ("request timeout (s)", "request_timeout_s"), ("retries", "retries"),
                ("warm-up", "warmup"), ("seed", "seed"), ("sending processes", "workers"),
                ("output length forcing", "output_forcing"), ("tokenizer", "tokenizer"), ("SLO", "slo"),
                ("clock", "clock"), ("labels", "labels"))),
)
ENGINE_ALIASES = {"tp": ("tp", "tensor_parallel_size"), "prefix_caching": ("prefix_caching", "enable_prefix_caching"),
                  "max_num_seqs": ("max_num_seqs",), "max_num_batched_tokens": ("max_num_batched_tokens",)}
ENV_FIELDS = (  # folded: the rest of the environment
    ("trace", "trace"), ("trace_digest", "trace digest"), ("workload", "workload"), ("shard", "shard"),
    ("start_unix", "started (UTC)"), ("command", "command line"),
)
NOT_RECORDED = '<span class="nr">not recorded</span>'
HEADLINE = (("requests", "requests"), ("failed", "failed"), ("request_rate_rps", "req/s"),
            ("goodput_rps", "goodput req/s"), ("output_tokens_per_s", "output tok/s"),
            ("goodput_tokens_per_s", "goodput tok/s"), ("total_tokens_per_s", "total tok/s"),
            ("samples_per_s", "samples/s"), ("slo_attainment", "SLO attainment"))
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))
LAT_STATS = ("p50", "p90", "p99", "p99_9")


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def render(data: ReportData, images: dict[str, str | None], *, plots_note: str | None = None) -> str:
    body = [f"<h1>{esc(data.title)}</h1>",
            f'<p class="meta">generated {esc(_utc(data.generated_unix))} by slogate · {len(data.runs)} run(s)</p>',
            "<nav>" + "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title, _ in SECTIONS) + "</nav>"]
    if plots_note:
        body.append(f'<p class="note" id="plots-note">{esc(plots_note)}</p>')
    builders = {"environment": _environment, "load": _load, "metrics": _metrics, "conclusions": _conclusions}
    for sid, title, how in SECTIONS:
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


def _env_cell(run: RunData, key: str) -> str:
    env = run.results.environment
    by = env.recorded_by
    if key == "engine.*":
        shown = {a for names in ENGINE_ALIASES.values() for a in names}
        rest = {k: v for k, v in env.engine.items() if k not in shown}
        return esc(", ".join(f"{k}={v}" for k, v in rest.items())) if rest else NOT_RECORDED
    if key.startswith("engine."):
        flag = key.removeprefix("engine.")
        for alias in ENGINE_ALIASES.get(flag, (flag,)):
            if alias in env.engine:
                src = by.get(f"engine.{alias}")
                return esc(env.engine[alias]) + (f'<span class="src">{esc(src)}</span>' if src else "")
        return NOT_RECORDED
    if key == "warmup":
        n = run.results.summary.warmup_requests
        spec = next((w for w in env.workload if w.startswith("warmup=")), None)
        return esc(f"{n} requests excluded" + (f" ({spec})" if spec else "")) if n or spec else "none"
    value = getattr(env, key, None)
    if value is None or value == [] or value == {} or value == "":
        return NOT_RECORDED
    src = by.get(key) or {"models": "/v1/models", "server_kind": "probe"}.get(key)
    return _env_value(key, value) + (f'<span class="src">{esc(src)}</span>' if src else "")


def _environment(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    header = ["field"] + [esc(r.name) for r in data.runs]
    parts = []
    for group, rows in ENV_ROWS:
        body = [[esc(label)] + [_env_cell(r, key) for r in data.runs] for label, key in rows]
        parts.append(f"<h3>{esc(group)}</h3>" + _table(header, body))
    rest = []
    for key, label in ENV_FIELDS:
        values = [getattr(r.results.environment, key, None) for r in data.runs]
        rest.append([esc(label)] + [_env_value(key, v) for v in values])
    parts.append("<details><summary>trace, workload and command line</summary>" + _table(header, rest) + "</details>")
    return "".join(parts)


def _load(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    from slogate.replay.report_model import anchor, load_profile

    header = ["run", "requests", "span (s)", "mean req/s", "burstiness CV", "peak minute req/s", "input tokens p50/p99",
              "output tokens p50/p99", "prefix reuse", "sessions", "warm-up excluded"]
    rows, figs = [], []
    for r in data.runs:
        lp = load_profile(r.records) if r.records else None
        s = r.results.summary
        if lp is None:
            rows.append([esc(r.name)] + ["–"] * 9 + [str(s.warmup_requests)])
        else:
            peak = "–" if lp.peak_minute_rps is None else f"{lp.peak_minute_rps:.3g} (from {lp.peak_minute_start_s:g} s)"
            rows.append([esc(r.name), str(lp.requests), f"{lp.span_s:.4g}", fmt("", lp.mean_rps),
                         "–" if lp.interarrival_cv is None else f"{lp.interarrival_cv:.2f}", esc(peak), f"{fmt('', lp.input_p50)} / {fmt('', lp.input_p99)}",
                         f"{fmt('', lp.output_p50)} / {fmt('', lp.output_p99)}",
                         "–" if lp.prefix_reuse is None else f"{lp.prefix_reuse:.1%}",
                         "–" if lp.sessions is None else str(lp.sessions), str(s.warmup_requests)])
        key = f"load:{r.name}"
        wl = " → ".join(r.results.environment.workload) or "not recorded"
        if key in images or note:
            figs.append(f'<div id="{anchor("load", r.name)}"><h3>{esc(r.name)}</h3><p class="meta">workload: {esc(wl)}</p>'
                        + _image(images.get(key), f"arrivals and length histograms of {r.name}", note) + "</div>")
        else:
            figs.append(f'<div id="{anchor("load", r.name)}"><p class="meta">{esc(r.name)} workload: {esc(wl)}</p></div>')
    return _table(header, rows) + "".join(figs)


def _lat_cell(data: ReportData, i: int, metric: str) -> str:
    flat0 = flatten(data.runs[0].results.summary)
    value = flatten(data.runs[i].results.summary).get(metric)
    cell = esc(fmt(metric, value))
    if i == 0:
        return cell
    _, rel = deltas(flat0.get(metric), value)
    if rel is None or math.isinf(rel):
        return cell
    ci = (data.cis[i - 1] or {}).get(metric) if len(data.cis) >= i else None
    mark, cls = "", ""
    if ci is not None:
        sig = ci[0] > 0 or ci[1] < 0
        mark = "*" if sig else "~"
        if sig:
            cls = "sig " + ("up" if rel < 0 else "down")
    title = f' title="95% CI of the change: {ci[0] * 1e3:+.3g}…{ci[1] * 1e3:+.3g} ms"' if ci is not None else ""
    return cell + f'<span class="d {cls}"{title}>{rel * 100:+.1f}%{mark}</span>'


def _metrics(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    from slogate.replay.report_model import anchor

    parts = []
    warn = "".join(f'<p class="warn">{esc(r.name)} is DEGRADED: {esc("; ".join(r.results.summary.degraded_reasons))}</p>'
                   for r in data.runs if r.results.summary.degraded)
    head = ["run"] + [label for _, label in HEADLINE]
    rows = []
    for r in data.runs:
        f = flatten(r.results.summary)
        rows.append([esc(r.name)] + ["–" if f.get(k) is None else
                                     (f"{f[k]:.1%}" if k == "slo_attainment" else esc(fmt(k, f.get(k)))) for k, _ in HEADLINE])
    parts.append(f'<div id="throughput"><h3>Throughput and goodput</h3>{warn}' + _table(head, rows) + "</div>")
    lhead = ["run"] + [f"{label} {q.replace('_', '.')} (ms)" for _, label in LATENCIES for q in LAT_STATS]
    lrows = [[esc(r.name)] + [_lat_cell(data, i, f"{m}.{q}") for m, _ in LATENCIES for q in LAT_STATS]
             for i, r in enumerate(data.runs)]
    parts.append('<div id="latency"><h3>Latency percentiles</h3>' + _table(lhead, lrows) + "</div>")
    parts.append(differences_html(data))  # replay.report_repeats; empty for one run
    classes = sorted({c for r in data.runs for c in r.results.summary.failed_by_class})
    ehead = ["run", "failed"] + [esc(c) for c in classes]
    erows = [[f'<span id="{anchor("errors", r.name)}">{esc(r.name)}</span>', str(r.results.summary.failed)]
             + [str(r.results.summary.failed_by_class.get(c, 0)) for c in classes] for r in data.runs]
    parts.append('<div id="errors"><h3>Errors by class</h3>' + _table(ehead, erows) + "</div>")
    parts.append('<div id="cdf"><h3>Latency distributions (CDF)</h3><p class="meta">fraction of successful requests '
                 "at or below each latency: further left is faster; the p99 is where a line crosses the dotted 0.99 "
                 "level (log x axis)</p>" + _image(images.get("cdf"), "TTFT, TPOT and E2E CDFs", note) + "</div>")
    parts.append('<div id="sweep"><h3>Throughput–latency curve</h3>' + _sweep(data, images, note) + "</div>")
    parts.append('<div id="telemetry"><h3>Timeline and server telemetry</h3><p class="meta">per run over time: '
                 "requests sent and completed per second, in flight, TTFT/E2E p50 and p99 per bin and, when scraped, "
                 "the server's queue, running requests, KV-cache usage, preemptions and prefix hits. Rising in-flight "
                 "with flat completions means the target is saturated.</p>" + _timeline(data, images, note) + "</div>")
    parts.append(sessions_html(data, images, note))  # replay.report_sessions; empty without sessions
    parts.append(_stability_block(data))
    parts.append("<details><summary>all summary metrics</summary>" + _summary(data, images, note) + "</details>")
    return "".join(parts)


def _stability_block(data: ReportData) -> str:
    from slogate.replay.report_model import anchor

    runs = [r for r in data.runs if r.stability is not None]
    if not runs:
        return ""
    parts = ['<div id="stability"><h3>Long-run stability</h3>']
    for r in runs:
        st = r.stability
        assert st is not None
        cls = "note" if st.stable else "warn"
        rows = [[f"{w.start_s:g}", str(w.requests), fmt("", w.output_tokens_per_s), fmt("", w.goodput_rps),
                 ms(w.ttft_p99_s), "–" if w.error_rate is None else f"{w.error_rate:.2%}"] for w in st.windows]
        parts.append(f'<div id="{anchor("stability", r.name)}"><p class="{cls}">{esc(r.name)}: {esc(st.verdict)}</p>'
                     f"<details><summary>{len(st.windows)} windows of {st.window_s:g} s</summary>"
                     + _table(["start (s)", "arrivals", "output tok/s", "goodput req/s", "TTFT p99 (ms)", "error rate"],
                              rows, key_col=False) + "</details></div>")
    return "".join(parts) + "</div>"


def _conclusions(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    items = []
    for c in data.conclusions:
        cls = ' class="warn"' if c.level == "warn" else ""
        items.append(f'<li{cls}><span class="topic">{esc(c.topic)}</span>{esc(c.text)} '
                     f'<a href="#{esc(c.figure)}">(figure)</a></li>')
    return '<ul class="concl">' + "".join(items) + "</ul>" if items else '<p class="note">no conclusions</p>'


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


def _timeline(data: ReportData, images: dict[str, str | None], note: str | None) -> str:
    from slogate.replay.report_model import anchor

    parts = []
    for r in data.runs:
        key = f"timeline:{r.name}"
        if key in images or note:
            parts.append(f'<div id="{anchor("telemetry", r.name)}"><h3>{esc(r.name)}</h3>'
                         + _image(images.get(key), f"timeline of {r.name}", note) + "</div>")
        else:
            parts.append(f'<div id="{anchor("telemetry", r.name)}"></div>')
    drawn = sum(1 for k in images if k.startswith("timeline:"))
    if not note and drawn < len(data.runs):
        parts.append(f'<p class="note">timelines drawn for the first {drawn} of {len(data.runs)} runs</p>')
    if any(r.scraped for r in data.runs):
        virtual = any(r.telemetry_source == "sim-virtual" for r in data.runs)
        parts.append('<p class="meta">the last panel shows the target\'s own metrics scraped during the run (metrics.jsonl)'
                     + ("; for virtual-time runs, the simulated engine's state sampled in virtual time" if virtual else "")
                     + "</p>")
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
    from slogate.replay.report_model import anchor

    if sw.planned is not None:  # plan vs measurement (replay.plan.vs_sweep)
        facts += f'<pre id="plan-vs-sweep-{esc(sw.name)}">' + esc("\n".join(vs_sweep_lines(sw.planned))) + "</pre>"
    return (f'<h3 id="{anchor("sweep", sw.name)}">{esc(sw.name)}</h3>' + facts + _image(images.get(f"sweep:{sw.name}"), f"sweep curve of {sw.name}", note)
            + _table(header, rows))
