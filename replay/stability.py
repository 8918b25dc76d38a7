"""Long-run stability of one run: per-window throughput, goodput, p99 TTFT and error rate (each window
summarized by `traces.summary.summarize`, the one summary) and, from the engine metrics scraped
during the run, KV-cache usage and server memory; their coefficient of variation, their trend
(least-squares slope per hour) and a one-line verdict against thresholds. `LiveWindow` is the current
window for the progress lines while the run goes on.

Pure functions of records and scraped samples; never reads or writes files (replay.cli.replay
writes stability.json).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import msgspec

from slogate.replay.significance import t975
from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord, is_error
from slogate.traces.slo import Slo
from slogate.traces.summary import Window, finished_at, offered_window, summarize

DEFAULT_CV = 0.05  # --stability-cv: largest throughput/goodput variation (and change over the run) called stable
LATENCY_DRIFT = 0.20  # largest p99 TTFT change over the whole run called stable (fraction of its mean)
ERROR_RATE_RISE = 0.01  # largest error-rate change over the run (absolute fraction of requests) called stable
KV_GROWTH = 0.10  # largest KV-cache usage change over the run (fraction of the cache) called stable
MEMORY_GROWTH = 0.05  # largest server memory change over the run (fraction of its mean) called stable
KV_METRIC, MEMORY_METRIC = "kv_cache_usage", "resident_memory_bytes"  # scraped sample keys (traces.engine_metrics)


class StabilityWindow(msgspec.Struct):
    start_s: float
    requests: int  # arrivals in the window
    output_tokens_per_s: float
    goodput_rps: float
    ttft_p99_s: float | None
    error_rate: float | None  # failed / arrivals
    kv_cache_usage: float | None = None  # mean of the scraped samples in the window (fraction of the cache)
    resident_memory_bytes: float | None = None  # mean of the scraped server memory samples in the window


class Trend(msgspec.Struct):
    mean: float | None = None
    cv: float | None = None  # population std / mean over the windows
    slope_per_h: float | None = None  # least-squares slope relative to the mean, per hour (0.03 = +3 %/h)
    change: float | None = None  # slope × run length: the fitted change over the run, relative to the mean
    significant: bool | None = None  # the slope differs from 0 at 95 % (Student's t on the windows' scatter)


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
    kv_cache_usage: Trend | None = None  # absolute (fraction of the cache); None: no KV usage was scraped
    resident_memory: Trend | None = None  # relative; None: no server memory was scraped


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
    sig = _significant(pts, mx, my, slope, sxx)
    if relative:
        if my <= 0:
            return Trend(mean=my, cv=None, slope_per_h=None, change=None)
        return Trend(mean=my, cv=sd / my, slope_per_h=slope * 3600 / my, change=slope * span / my, significant=sig)
    return Trend(mean=my, cv=sd / my if my > 0 else None, slope_per_h=slope * 3600, change=slope * span,
                 significant=sig)


def _significant(pts: Sequence[tuple[float, float]], mx: float, my: float, slope: float, sxx: float) -> bool | None:
    """Whether the least-squares slope differs from 0 at 95 %: |slope| / its standard error > Student's t
    (windows − 2 degrees of freedom). A window's p99 rests on its few slowest requests, so a p99 drift
    counts only when the trend stands out of the windows' own scatter."""
    dof = len(pts) - 2
    if dof < 1 or sxx <= 0:
        return None
    ssr = math.fsum((y - (my + slope * (x - mx))) ** 2 for x, y in pts)
    se = math.sqrt(ssr / dof / sxx)
    return slope != 0 and (se == 0 or abs(slope) / se > t975(dof))


def _sample_mean(samples: Sequence[dict[str, float]], key: str, start: float, end: float) -> float | None:
    vals = [s[key] for s in samples if key in s and start <= s.get("t", -1.0) < end]
    return math.fsum(vals) / len(vals) if vals else None


def stability(records: Sequence[RequestRecord], window_s: float, *, slos: Sequence[Slo] = (),
              cv_threshold: float = DEFAULT_CV, samples: Sequence[dict[str, float]] = ()) -> Stability:
    """Cut the offered window into `window_s` windows (a partial last window is dropped) and judge them.
    `samples` are the scraped engine metrics (metrics.jsonl lines: `t` on the records' time base)."""
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
            error_rate=(lat.failed / len(arrivals)) if lat and arrivals else None,
            kv_cache_usage=_sample_mean(samples, KV_METRIC, w.start, w.end),
            resident_memory_bytes=_sample_mean(samples, MEMORY_METRIC, w.start, w.end)))
    xs = [w.start_s + window_s / 2 for w in windows]
    thr = _trend(xs, [w.output_tokens_per_s for w in windows])
    good = _trend(xs, [w.goodput_rps for w in windows])
    p99 = _trend(xs, [w.ttft_p99_s for w in windows])
    err = _trend(xs, [w.error_rate for w in windows], relative=False)
    kv = _trend(xs, [w.kv_cache_usage for w in windows], relative=False)
    mem = _trend(xs, [w.resident_memory_bytes for w in windows])
    kv_t = kv if kv.mean is not None else None
    mem_t = mem if mem.mean is not None else None
    reasons = _reasons(thr, good, p99, err, cv_threshold, len(windows)) + _server_reasons(kv_t, mem_t, len(windows))
    span = n_windows * window_s
    verdict = _verdict(thr, good, p99, err, span, reasons, len(windows), kv_t, mem_t)
    return Stability(window_s=window_s, span_s=span, windows=windows, throughput=thr, goodput=good, ttft_p99=p99,
                     error_rate=err, cv_threshold=cv_threshold, stable=not reasons and len(windows) >= 3,
                     verdict=verdict, reasons=reasons, kv_cache_usage=kv_t, resident_memory=mem_t)


def _server_reasons(kv: Trend | None, mem: Trend | None, n: int) -> list[str]:
    if n < 3:
        return []
    out = []
    if kv is not None and kv.change is not None and kv.change > KV_GROWTH:
        out.append(f"KV-cache usage grew {kv.change * 100:+.1f} points over the run (> {KV_GROWTH * 100:g})")
    if mem is not None and mem.change is not None and mem.change > MEMORY_GROWTH:
        out.append(f"server memory grew {mem.change:+.1%} over the run (> {MEMORY_GROWTH:.0%})")
    return out


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
    if p99.change is not None and abs(p99.change) > LATENCY_DRIFT and p99.significant is not False:
        out.append(f"p99 TTFT drifted {p99.change:+.1%} over the run (> ±{LATENCY_DRIFT:.0%}, beyond the windows' scatter)")
    if err.change is not None and abs(err.change) > ERROR_RATE_RISE:
        out.append(f"error rate changed {err.change * 100:+.2f} points over the run (> ±{ERROR_RATE_RISE * 100:g})")
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:+.1f} %"


def _span(s: float) -> str:
    return f"{s / 3600:.3g} h" if s >= 3600 else f"{s / 60:.3g} min" if s >= 120 else f"{s:.3g} s"


def _verdict(thr: Trend, good: Trend, p99: Trend, err: Trend, span: float, reasons: list[str], n: int,
             kv: Trend | None = None, mem: Trend | None = None) -> str:
    facts = (f"throughput varied {(thr.cv or 0) * 100:.1f} % over {_span(span)} ({n} windows), trend "
             f"{_pct(thr.slope_per_h)}/h; goodput trend {_pct(good.slope_per_h)}/h; p99 TTFT {_pct(p99.slope_per_h)}/h"
             f" ({_pct(p99.change)} over the run); error rate {_pct(err.change)} over the run")
    if kv is not None:
        facts += f"; KV-cache usage {(kv.change or 0) * 100:+.1f} points over the run (mean {kv.mean:.0%})"
    if mem is not None:
        facts += f"; server memory {_pct(mem.change)} over the run"
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


class LiveWindow:
    """The current `--stability` window while a run goes on (the progress lines): output tokens/s, p99
    TTFT and p50 TPOT of the requests that finished in the last `window_s` (on the records' clock:
    arrival + lag + e2e) and each one's change against the first full window of the run."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.recent: collections.deque[tuple[float, int, float | None, float | None]] = collections.deque()
        self.latest = 0.0
        self.first: tuple[float, float | None, float | None] | None = None

    def add(self, records: Sequence[RequestRecord]) -> None:
        for r in records:
            end = finished_at(r)
            ok = not is_error(r)
            self.recent.append((end, r.output_tokens or 0, r.ttft if ok else None, r.tpot if ok else None))
            self.latest = max(self.latest, end)
        cut = self.latest - self.window_s
        while self.recent and self.recent[0][0] < cut:
            self.recent.popleft()
        if self.first is None and self.latest >= self.window_s:
            self.first = self.current()

    def current(self) -> tuple[float, float | None, float | None]:
        """(output tokens/s, p99 TTFT, p50 TPOT) of the last window."""
        inside = [e for e in self.recent if e[0] >= self.latest - self.window_s]
        ttft = sorted(e[2] for e in inside if e[2] is not None)
        tpot = sorted(e[3] for e in inside if e[3] is not None)
        return (sum(e[1] for e in inside) / self.window_s, percentile(ttft, 99) if ttft else None,
                percentile(tpot, 50) if tpot else None)

    def text(self) -> str:
        """`window 1m: 812 tok/s (+2.1 %), TTFT p99 420 ms (+35.0 %), TPOT p50 21 ms (+0.5 %)`; the
        changes are against the first full window (none yet: no change shown)."""
        now = self.current()
        first = self.first

        def change(i: int) -> str:
            a, b = (first[i] if first else None), now[i]
            return "" if a is None or b is None or a == 0 else f" ({(b - a) / a * 100:+.1f} %)"

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.0f} ms"

        return (f"window {_span(self.window_s)}: {now[0]:.0f} tok/s{change(0)}, TTFT p99 {ms(now[1])}{change(1)}, "
                f"TPOT p50 {ms(now[2])}{change(2)}")
