"""The report's plots as inline base64 PNGs: TTFT/TPOT/E2E CDFs, per-run timelines, sweep curves.

Imported only when matplotlib is installed (the `report` extra); uses the Agg backend and never
opens a window or fetches anything. Every function returns a `data:` URI string (or None).
"""

from __future__ import annotations

import base64
import io
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord, effective_e2e, is_error

if TYPE_CHECKING:
    from slogate.replay.report_model import ReportData, RunData, SweepData

DPI = 100
CDF_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _png(fig) -> str:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def draw_all(data: ReportData, *, max_timelines: int) -> dict[str, str | None]:
    images: dict[str, str | None] = {"cdf": cdf(data.runs)}
    for run in data.runs[:max_timelines]:
        images[f"timeline:{run.name}"] = timeline(run)
        images[f"load:{run.name}"] = load(run)
    for sw in data.sweeps:
        images[f"sweep:{sw.name}"] = sweep_curve(sw)
    return images


def load(run: RunData) -> str | None:
    """Arrivals per second over the run, and the prompt and output length histograms."""
    from slogate.replay.report_model import load_profile

    if not run.records:
        return None
    lp = load_profile(run.records)
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.0), gridspec_kw={"width_ratios": [2, 1, 1]})
    axes[0].step(range(len(lp.arrivals_per_s)), lp.arrivals_per_s, where="post", linewidth=1.2)
    if lp.mean_rps:
        axes[0].axhline(lp.mean_rps, color="grey", linestyle=":", linewidth=1.0, label=f"mean {lp.mean_rps:.3g}/s")
        axes[0].legend(fontsize=8, loc="upper right")
    axes[0].set_xlabel("seconds since the first arrival")
    axes[0].set_ylabel("arrivals per second")
    cv = "–" if lp.interarrival_cv is None else f"{lp.interarrival_cv:.2f}"
    axes[0].set_title(f"{run.name}: arrival rate (burstiness CV {cv})", fontsize=9)
    for ax, vals, label in ((axes[1], lp.input_tokens, "input tokens"), (axes[2], lp.output_tokens, "output tokens")):
        if vals:
            ax.hist(vals, bins=min(40, max(5, len(set(vals)))), color="tab:blue" if "input" in label else "tab:orange")
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(label)
        ax.set_title(f"{label} per request", fontsize=9)
    axes[1].set_ylabel("requests")
    fig.tight_layout()
    return _png(fig)


def cdf(runs: Sequence[RunData]) -> str | None:
    """One panel per metric, one line per run (successful requests; x in ms, log scale)."""
    if not any(r.records for r in runs):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (key, label) in zip(axes, CDF_METRICS, strict=True):
        drawn = False
        for run in runs:
            values = sorted(getattr(r, key) * 1e3 for r in run.records if not is_error(r) and getattr(r, key) is not None)
            if not values:
                continue
            n = len(values)
            ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=run.name, linewidth=1.4)
            drawn = True
        ax.set_title(f"{label} CDF")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylim(0, 1.01)
        if drawn:
            _log_axis(ax, "x")
            for q in (0.5, 0.99):
                ax.axhline(q, color="grey", linewidth=0.6, linestyle=":")
        else:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_ylabel("fraction of requests ≤ x")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles and len(runs) > 1:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(runs), 6), bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    return _png(fig)


def _log_axis(ax, which: str) -> None:  # type: ignore[no-untyped-def]
    """Log scale with plain-number labels (no overlapping 3×10^1-style minor labels)."""
    from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(StrMethodFormatter("{x:g}"))
    axis.set_minor_formatter(NullFormatter())


def _bins(records: Sequence[RequestRecord]) -> tuple[float, float, int]:
    """Time bins: about 50 over the run, but wide enough to hold ~5 requests each on average."""
    end = max(r.t + (effective_e2e(r) or 0.0) for r in records)
    start = min(r.t for r in records)
    span = max(end - start, 1e-3)
    width = max(span / 50.0, 5.0 * span / len(records), 0.01)
    return start, width, int(span / width) + 1


class _Series:
    """Per-bin series of one run: sends and completions per second, mean in flight, latencies (ms)."""

    def __init__(self, recs: Sequence[RequestRecord]) -> None:
        self.start, self.width, n = _bins(recs)
        self.mids = [self.start + (i + 0.5) * self.width for i in range(n)]
        sent, done, busy = [0] * n, [0] * n, [0.0] * n
        self.ttft: list[list[float]] = [[] for _ in range(n)]
        self.e2e: list[list[float]] = [[] for _ in range(n)]
        for r in recs:
            send = r.t + (r.lag or 0.0)
            end = send + (r.e2e or 0.0)
            i, j = self._bin(send, n), self._bin(end, n)
            sent[i] += 1
            done[j] += 1
            for k in range(i, j + 1):  # time-weighted: each request adds its overlap with the bin
                lo, hi = self.start + k * self.width, self.start + (k + 1) * self.width
                busy[k] += max(0.0, min(end, hi) - max(send, lo))
            if not is_error(r):
                if r.ttft is not None:
                    self.ttft[i].append(r.ttft * 1e3)
                if r.e2e is not None:
                    self.e2e[i].append(r.e2e * 1e3)
        self.sent = [c / self.width for c in sent]
        self.done = [c / self.width for c in done]
        self.inflight = [b / self.width for b in busy]

    def _bin(self, t: float, n: int) -> int:
        return max(0, min(int((t - self.start) / self.width), n - 1))


def timeline(run: RunData) -> str | None:
    """Request rate, in-flight and latency over the run (time from the first intended send)."""
    if not run.records:
        return None
    plt = _plt()
    s = _Series(run.records)
    panels = 4 if run.scraped else 3
    fig, axes = plt.subplots(panels, 1, figsize=(12, 1.7 * panels + 0.4), sharex=True)
    axes[0].plot(s.mids, s.sent, label="sent /s", linewidth=1.3)
    axes[0].plot(s.mids, s.done, label="completed /s", linewidth=1.0, alpha=0.8)
    axes[0].set_ylabel("requests/s")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title(f"{run.name}: timeline ({s.width:.3g} s bins)")
    axes[1].plot(s.mids, s.inflight, color="tab:purple", linewidth=1.3)
    axes[1].set_ylabel("in flight (mean)")
    for bins, label, color in ((s.ttft, "TTFT", "tab:blue"), (s.e2e, "E2E", "tab:orange")):
        xs = [m for m, b in zip(s.mids, bins, strict=True) if b]
        if xs:
            axes[2].plot(xs, [percentile(sorted(b), 50) for b in bins if b], color=color, linewidth=1.3, label=f"{label} p50")
            axes[2].plot(xs, [percentile(sorted(b), 99) for b in bins if b], color=color, linewidth=1.0,
                         linestyle="--", label=f"{label} p99")
    axes[2].set_ylabel("latency (ms)")
    if any(s.ttft) or any(s.e2e):
        axes[2].legend(loc="upper right", fontsize=8, ncol=4)
    else:  # every request failed: no latency to draw
        axes[2].text(0.5, 0.5, "no successful request", ha="center", va="center", transform=axes[2].transAxes)
    if run.scraped:
        _scraped_panel(axes[3], run.scraped)
    axes[-1].set_xlabel("seconds since the run started")
    fig.tight_layout()
    return _png(fig)


def scraped_series(samples: Sequence[dict[str, float]]) -> dict[str, list[tuple[float, float]]]:
    """Plot-ready series: gauges as sampled, counters (`*_total`) as per-second rates, and the
    prefix-cache hit rate per interval (hits / queries) instead of its two counters."""
    raw: dict[str, list[tuple[float, float]]] = {}
    for sample in samples:
        for name, value in sample.items():
            if name != "t":
                raw.setdefault(name, []).append((sample["t"], value))
    out: dict[str, list[tuple[float, float]]] = {}
    hits, queries = raw.pop("prefix_cache_hits_total", None), raw.pop("prefix_cache_queries_total", None)
    if hits and queries and len(hits) == len(queries):
        out["prefix cache hit rate"] = [(b[0], (b[1] - a[1]) / (qb[1] - qa[1])) for a, b, qa, qb
                                        in zip(hits, hits[1:], queries, queries[1:], strict=False) if qb[1] > qa[1]]
    for name, pts in raw.items():
        if name.endswith("_total"):
            out[name.removesuffix("_total") + " /s"] = [
                (b[0], (b[1] - a[1]) / (b[0] - a[0])) for a, b in itertools.pairwise(pts) if b[0] > a[0]]
        else:
            out[name] = pts
    return {k: v for k, v in out.items() if v}


def _scraped_panel(ax, samples: Sequence[dict[str, float]]) -> None:  # type: ignore[no-untyped-def]
    """Counts (running, waiting, preemptions/s) on the left axis; fractions (KV-cache usage, hit
    rates: never above 1) on a right axis from 0 to 1."""
    right = None
    right_colors = iter(("tab:gray", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"))
    series = {k: v for k, v in scraped_series(samples).items() if k != "resident_memory_bytes"}  # bytes: no common axis
    for name, pts in list(series.items())[:10]:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if max(ys) <= 1.0 and ("usage" in name or "rate" in name):
            right = right or ax.twinx()
            right.plot(xs, ys, linewidth=1.0, linestyle="--", label=name, color=next(right_colors, "black"))
            right.set_ylim(0, 1.05)
            right.set_ylabel("fraction")
        else:
            ax.plot(xs, ys, linewidth=1.2, label=name)
    ax.set_ylabel("target metrics")
    ax.set_title("target metrics (scraped /metrics)", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=7, ncol=3)
    if right is not None:
        right.legend(loc="upper right", fontsize=7)


def sweep_curve(sw: SweepData) -> str | None:
    """Throughput vs p50/p99 TTFT with the SLO line and the knee; attainment vs load beside it."""
    pts = sw.sweep.points
    if not pts:
        return None
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    thr = [p.throughput for p in pts]
    unit = "output tokens/s" if any(p.output_tokens_per_s > 0 for p in pts) else "requests/s"
    for key, style, label in (("ttft_p99_s", "o-", "TTFT p99"), ("ttft_p50_s", "s--", "TTFT p50")):
        xy = [(t, getattr(p, key) * 1e3) for t, p in zip(thr, pts, strict=True) if getattr(p, key) is not None]
        if xy:
            ax.plot([a for a, _ in xy], [b for _, b in xy], style, label=label, linewidth=1.4, markersize=5)
    for t, p in zip(thr, pts, strict=True):
        if p.ttft_p99_s is not None:
            ax.annotate(f"{p.x:g}", (t, p.ttft_p99_s * 1e3), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if sw.sweep.slo_ttft_s is not None:
        ax.axhline(sw.sweep.slo_ttft_s * 1e3, color="red", linestyle=":", linewidth=1.2, label="SLO TTFT bound")
    knee = next((p for p in pts if p.x == sw.sweep.knee), None)
    if knee is not None and knee.ttft_p99_s is not None:
        ax.plot([knee.throughput], [knee.ttft_p99_s * 1e3], marker="*", markersize=16, color="crimson",
                linestyle="none", label=f"knee ({sw.sweep.mode} {knee.x:g})")
    _log_axis(ax, "y")
    ax.set_xlabel(f"throughput ({unit})")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("throughput–latency (labels: load)")
    ax.legend(fontsize=8)
    xs = [p.x for p in pts]
    ax2.plot(xs, [p.slo_attainment if p.slo_attainment is not None else float("nan") for p in pts], "o-", linewidth=1.4)
    ax2.axhline(sw.sweep.attainment_target, color="red", linestyle=":", linewidth=1.2,
                label=f"target {sw.sweep.attainment_target:.0%}")
    if sw.sweep.max_x_meeting_slo is not None:
        ax2.axvline(sw.sweep.max_x_meeting_slo, color="green", linestyle="--", linewidth=1.0,
                    label=f"max {sw.sweep.mode} meeting it: {sw.sweep.max_x_meeting_slo:g}")
    ax2.set_ylim(-0.02, 1.05)
    ax2.set_xlabel(sw.sweep.mode)
    ax2.set_ylabel("SLO attainment")
    ax2.set_title("SLO attainment by load")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)
