"""Long-run stability of one run: per-window throughput, goodput, p99 TTFT and error rate (each window
summarized by `traces.summary.summarize`, the one summary), their coefficient of variation, their
trend (least-squares slope, relative to the mean, per hour) and a one-line verdict against thresholds.

Pure functions of records; never reads or writes files (replay.cli.replay writes stability.json).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from slogate.traces.record import RequestRecord
from slogate.traces.slo import Slo
from slogate.traces.summary import Window, finished_at, offered_window, summarize

DEFAULT_CV = 0.05  # --stability-cv: largest throughput/goodput variation (and change over the run) called stable
LATENCY_DRIFT = 0.20  # largest p99 TTFT change over the whole run called stable (fraction of its mean)
ERROR_RATE_RISE = 0.01  # largest error-rate change over the run (absolute fraction of requests) called stable


class StabilityWindow(msgspec.Struct):
    start_s: float
    requests: int  # arrivals in the window
    output_tokens_per_s: float
    goodput_rps: float
    ttft_p99_s: float | None
    error_rate: float | None  # failed / arrivals


class Trend(msgspec.Struct):
    mean: float | None = None
    cv: float | None = None  # population std / mean over the windows
    slope_per_h: float | None = None  # least-squares slope relative to the mean, per hour (0.03 = +3 %/h)
    change: float | None = None  # slope × run length: the fitted change over the run, relative to the mean


class Stability(msgspec.Struct):
    """`stability.json`."""

    window_s: float
    span_s: float
    windows: list[StabilityWindow]
    throughput: Trend  # output tokens/s
    goodput: Trend  # good requests/s
    ttft_p99: Trend
    error_rate: Trend  # slope/change here are absolute (fraction of requests), not relative
    cv_threshold: float
    stable: bool
    verdict: str
    reasons: list[str] = []


def _trend(xs: Sequence[float], ys: Sequence[float | None], *, relative: bool = True) -> Trend:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if len(pts) < 2:
        return Trend(mean=pts[0][1] if pts else None)
    n = len(pts)
    mx = math.fsum(p[0] for p in pts) / n
    my = math.fsum(p[1] for p in pts) / n
    sxx = math.fsum((p[0] - mx) ** 2 for p in pts)
    slope = math.fsum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx > 0 else 0.0  # per second
    sd = math.sqrt(math.fsum((p[1] - my) ** 2 for p in pts) / n)
    span = pts[-1][0] - pts[0][0]
    if relative:
        if my <= 0:
            return Trend(mean=my, cv=None, slope_per_h=None, change=None)
        return Trend(mean=my, cv=sd / my, slope_per_h=slope * 3600 / my, change=slope * span / my)
    return Trend(mean=my, cv=sd / my if my > 0 else None, slope_per_h=slope * 3600, change=slope * span)


def stability(records: Sequence[RequestRecord], window_s: float, *, slos: Sequence[Slo] = (),
              cv_threshold: float = DEFAULT_CV) -> Stability:
    """Cut the offered window into `window_s` windows (a partial last window is dropped) and judge them."""
    recs = sorted(records, key=lambda r: r.t)
    whole = offered_window(recs)
    n_windows = int(whole.length // window_s) if window_s > 0 else 0
    windows: list[StabilityWindow] = []
    for i in range(n_windows):
        w = Window(whole.start + i * window_s, whole.start + (i + 1) * window_s)
        arrivals = [r for r in recs if w.start <= r.t < w.end]
        # every request that overlaps the window contributes its tokens produced inside it
        overlap = [r for r in recs if r.t < w.end and finished_at(r) >= w.start]
        rates = summarize(overlap, window=w, slos=slos)
        lat = summarize(arrivals, window=w, slos=slos) if arrivals else None
        windows.append(StabilityWindow(
            start_s=w.start - whole.start, requests=len(arrivals), output_tokens_per_s=rates.output_tokens_per_s,
            goodput_rps=_goodput_of_arrivals(lat, len(arrivals), window_s) if slos else rates.request_rate_rps,
            ttft_p99_s=lat.ttft_s.p99 if lat else None,
            error_rate=(lat.failed / len(arrivals)) if lat and arrivals else None))
    xs = [w.start_s + window_s / 2 for w in windows]
    thr = _trend(xs, [w.output_tokens_per_s for w in windows])
    good = _trend(xs, [w.goodput_rps for w in windows])
    p99 = _trend(xs, [w.ttft_p99_s for w in windows])
    err = _trend(xs, [w.error_rate for w in windows], relative=False)
    reasons = _reasons(thr, good, p99, err, cv_threshold, len(windows))
    span = n_windows * window_s
    return Stability(window_s=window_s, span_s=span, windows=windows, throughput=thr, goodput=good, ttft_p99=p99,
                     error_rate=err, cv_threshold=cv_threshold, stable=not reasons and len(windows) >= 3,
                     verdict=_verdict(thr, good, p99, err, span, reasons, len(windows)), reasons=reasons)


def _goodput_of_arrivals(lat, arrivals: int, window_s: float) -> float:  # type: ignore[no-untyped-def]
    """Good requests among the window's arrivals per second (attainment × arrivals / window)."""
    if lat is None or lat.slo_attainment is None:
        return 0.0
    return lat.slo_attainment * arrivals / window_s


def _reasons(thr: Trend, good: Trend, p99: Trend, err: Trend, cv: float, n: int) -> list[str]:
    out: list[str] = []
    if n < 3:
        return [f"only {n} full window(s): too short to judge (use a shorter --stability window or a longer run)"]
    for name, t in (("throughput", thr), ("goodput", good)):
        if t.cv is not None and t.cv > cv:
            out.append(f"{name} varied {t.cv:.1%} between windows (> {cv:.1%})")
        if t.change is not None and abs(t.change) > cv:
            out.append(f"{name} trend {t.change:+.1%} over the run (> ±{cv:.1%})")
    if p99.change is not None and abs(p99.change) > LATENCY_DRIFT:
        out.append(f"p99 TTFT drifted {p99.change:+.1%} over the run (> ±{LATENCY_DRIFT:.0%})")
    if err.change is not None and abs(err.change) > ERROR_RATE_RISE:
        out.append(f"error rate changed {err.change * 100:+.2f} points over the run (> ±{ERROR_RATE_RISE * 100:g})")
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:+.1f} %"


def _span(s: float) -> str:
    return f"{s / 3600:.3g} h" if s >= 3600 else f"{s / 60:.3g} min" if s >= 120 else f"{s:.3g} s"


def _verdict(thr: Trend, good: Trend, p99: Trend, err: Trend, span: float, reasons: list[str], n: int) -> str:
    facts = (f"throughput varied {(thr.cv or 0) * 100:.1f} % over {_span(span)} ({n} windows), trend "
             f"{_pct(thr.slope_per_h)}/h; goodput trend {_pct(good.slope_per_h)}/h; p99 TTFT {_pct(p99.slope_per_h)}/h"
             f" ({_pct(p99.change)} over the run); error rate {_pct(err.change)} over the run")
    head = "STABLE" if not reasons else "UNSTABLE"
    return f"{head}: {facts}" + ("" if not reasons else "; " + "; ".join(reasons))


def parse_window(text: str, what: str = "--stability") -> float:
    """`1m`, `30s`, `500ms`, `1h` or plain seconds, > 0; raises ValueError naming the bad value."""
    t = text.strip().lower()
    scale = {"h": 3600.0, "m": 60.0, "min": 60.0}
    for unit, factor in sorted(scale.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(unit) and not t.endswith("ms"):
            t, mult = t[: -len(unit)], factor
            break
    else:
        mult = 1.0
        if t.endswith("ms"):
            t, mult = t[:-2], 1e-3
        elif t.endswith("s"):
            t = t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        value = -1.0
    if not value > 0 or math.isinf(value):
        raise ValueError(f"bad {what} {text!r}: expected a window length like '1m', '30s' or '1h'")
    return value
