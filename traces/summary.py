"""The one summary: a pure function from a set of request records (and a window) to every headline number.

`/slogate/status`, `results.json`, `slogate compare`, `slogate trace stats`, `slogate report` and
the demo all call `summarize`; the README's definitions table describes exactly what it does.
Never reads a clock or a file: the caller chooses the records and the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from slogate.traces.metrics import Summary, gaps
from slogate.traces.metrics import summarize as distribution
from slogate.traces.record import RequestRecord, effective_e2e, error_class, is_error
from slogate.traces.slo import Slo, is_good


class Window(msgspec.Struct, frozen=True):
    """The time span rates are measured over, in the records' time base (seconds, like `record.t`)."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return max(self.end - self.start, 0.0)


class RunSummary(msgspec.Struct, omit_defaults=False):
    """The headline numbers of a set of requests (`results.json` "summary", `compare --json`).

    Rates (`*_per_s`, `*_rps`) are over the window `window_start_s`…+`duration_s`; counts, attainment
    and percentiles are over all the records given. Latency percentiles use successful requests only.
    """

    requests: int = 0
    failed: int = 0
    failed_by_class: dict[str, int] = {}  # ErrorClass -> requests
    duration_s: float = 0.0  # length of the throughput window
    window_start_s: float = 0.0  # where the window starts (record time base: seconds from the trace/run start)
    request_rate_rps: float = 0.0  # requests inside the window (each by the share of its output produced there) / window
    offered_rate_rps: float | None = None
    output_tokens_per_s: float = 0.0  # output tokens produced inside the window (failed streams too) / window
    total_tokens_per_s: float = 0.0  # + input tokens of the requests inside the window (by the same shares)
    samples_per_s: float = 0.0  # embeddings inputs (1 per other request), by the same shares
    goodput_rps: float = 0.0
    goodput_tokens_per_s: float = 0.0
    slo_attainment: float | None = None
    slo: str | None = None  # name of the SLO goodput uses
    goodput_by_slo: dict[str, dict[str, float]] = {}  # name -> {good_requests, goodput_rps, goodput_tokens_per_s, slo_attainment}
    drain_s: float = 0.0  # last completion − window end (0 when everything finished inside)
    drain_requests: int = 0  # requests that finished after the window
    drain_output_tokens: int = 0  # output tokens produced after the window
    output_tokens: int = 0  # all output tokens of all records (failed streams too)
    input_tokens: int = 0
    input_tokens_estimated: int = 0  # records whose input_tokens is an estimate (no usage sent)
    ttft_s: Summary = msgspec.field(default_factory=Summary)
    tpot_s: Summary = msgspec.field(default_factory=Summary)
    itl_s: Summary = msgspec.field(default_factory=Summary)  # pooled gaps, from records that carry chunk times
    e2e_s: Summary = msgspec.field(default_factory=Summary)
    effective_e2e_s: Summary = msgspec.field(default_factory=Summary)
    schedule_lag_s: Summary = msgspec.field(default_factory=Summary)
    input_token_drift: float | None = None  # token-weighted mean |achieved − planned| / planned
    output_token_drift: float | None = None
    input_drift_requests: int | None = None  # requests more than one token off
    output_drift_requests: int | None = None
    input_drift_worst: float | None = None  # the worst single request's relative drift
    output_drift_worst: float | None = None
    unreachable_requests: int | None = None  # planned prompt shorter than the target's own template tokens
    degraded: bool = False
    degraded_reasons: list[str] = []
    send_rate_rps: float | None = None  # requests actually sent per second (vs offered_rate_rps)
    lag_bound_s: float | None = None  # the schedule-lag p99 bound that marks a run degraded
    warmup_requests: int = 0  # sent before the measured requests and excluded from every figure
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM: in-flight requests drained then cancelled, the rest not sent
    planned_requests: int | None = None  # interrupted runs: requests in the schedule (warmup included; None: closed loop)
    sent_requests: int | None = None  # interrupted runs: requests sent (= requests + warmup_requests)
    cancelled_requests: int | None = None  # interrupted runs: sent but cancelled after the drain (status 499)
    not_sent_requests: int | None = None  # interrupted runs: planned_requests − sent_requests
    cost_per_hour_usd: float | None = None
    cost_per_million_output_tokens: float | None = None
    cost_per_1k_requests: float | None = None
    goodput_cost_per_million_output_tokens: float | None = None
    goodput_cost_per_1k_requests: float | None = None


class Planned(msgspec.Struct, array_like=True, frozen=True):
    """What a replay meant to send for one record: the prompt and output lengths of the trace."""

    input_tokens: int | None
    output_tokens: int | None


# -- windows -----------------------------------------------------------------------------------------


def finished_at(record: RequestRecord) -> float:
    """When the request ended, in the record time base: arrival (+ send lag) + E2E."""
    return record.t + (record.lag or 0.0) + (record.e2e or 0.0)


def offered_window(records: Sequence[RequestRecord]) -> Window:
    """The window every candidate replaying the same schedule shares: from the first arrival, one mean
    inter-arrival gap past the last (n gaps for n requests, so the offered rate is n / window).

    Depends only on the arrival (intended send) times, never on how fast the candidate answered."""
    if not records:
        return Window(0.0, 0.0)
    times = [r.t for r in records]
    first, last = min(times), max(times)
    if len(times) < 2 or last <= first:
        return Window(first, max(finished_at(r) for r in records))  # one instant: the requests' own span
    return Window(first, last + (last - first) / (len(times) - 1))


def run_window(records: Sequence[RequestRecord]) -> Window:
    """First actual send to last completion: the window of a closed loop, which has no offered schedule."""
    if not records:
        return Window(0.0, 0.0)
    return Window(min(r.t + (r.lag or 0.0) for r in records), max(finished_at(r) for r in records))


# -- tokens in time --------------------------------------------------------------------------------


def output_tokens_in(record: RequestRecord, start: float, end: float) -> float:
    """Output tokens of `record` produced inside [start, end): each token counted at the time it was
    produced. Chunk times when the record has them (usage tokens spread evenly over the chunks);
    otherwise the first token at TTFT and the rest evenly up to E2E; non-streamed: all at E2E."""
    n = record.output_tokens or 0
    if n <= 0:
        return 0.0
    base = record.t + (record.lag or 0.0)
    times = record.chunk_times
    if times:
        inside = sum(1 for c in times if start <= base + c < end)
        return n * inside / len(times)
    e2e = record.e2e or 0.0
    ttft = record.ttft
    if ttft is None or n == 1 or e2e <= ttft:
        t_last = base + (e2e if ttft is None or n > 1 else ttft)
        return float(n) if start <= t_last < end else 0.0
    first = 1.0 if start <= base + ttft < end else 0.0
    lo, hi = base + ttft, base + e2e  # the other n − 1 tokens, evenly over (lo, hi]
    if hi <= lo:  # E2E and TTFT equal to float precision
        return float(n) if start <= lo < end else 0.0
    overlap = max(0.0, min(hi, end) - max(lo, start))
    return first + (n - 1) * overlap / (hi - lo)


# -- the summary -----------------------------------------------------------------------------------


def summarize(
    records: Sequence[RequestRecord],
    *,
    window: Window | None = None,
    slos: Sequence[Slo] = (),
    planned: Sequence[Planned] | None = None,
    input_floor: int | None = None,
    offered_rate_rps: float | None = None,
    cost_per_hour_usd: float | None = None,
) -> RunSummary:
    """Every headline number of `records` (see README "What slogate measures").

    `window`: where rates are measured (default: the offered window of the records' arrivals).
    `planned`: per record, the lengths a replay meant to send (drift); `input_floor`: the fewest
    prompt tokens the target can be sent (its chat template's own tokens): shorter plans are
    unreachable, not drift."""
    if window is None:
        window = offered_window(records)
    start, end = window.start, window.end
    span = window.length

    def per_s(amount: float) -> float:  # over a window of no time (one request failing at once) nothing is a rate
        return amount / span if span > 0 else 0.0

    n = len(records)
    ok = [r for r in records if not is_error(r)]
    ends = [finished_at(r) for r in records]
    produced = [output_tokens_in(r, start, end) if r.output_tokens else 0.0 for r in records]
    # How much of each request the window holds: the share of its output produced inside (a request
    # without output: 1 when it finished inside). Requests/s and input tokens/s count these shares,
    # so they follow the tokens: a request still streaming at the window's end counts in part.
    share = [p / r.output_tokens if r.output_tokens else float(start <= e <= end)
             for r, p, e in zip(records, produced, ends, strict=True)]
    out_inside = math.fsum(produced)
    in_inside = math.fsum((r.input_tokens or 0) * f for r, f in zip(records, share, strict=True))
    samples = math.fsum((r.n_inputs or 1) * f for r, f in zip(records, share, strict=True))
    failed_by_class: dict[str, int] = {}
    for r in records:
        cls = error_class(r)
        if cls is not None:
            failed_by_class[cls] = failed_by_class.get(cls, 0) + 1
    summary = RunSummary(
        requests=n,
        failed=n - len(ok),
        failed_by_class=dict(sorted(failed_by_class.items())),
        duration_s=window.length,
        window_start_s=start,
        request_rate_rps=per_s(math.fsum(share)),
        offered_rate_rps=offered_rate_rps,
        output_tokens_per_s=per_s(out_inside),
        total_tokens_per_s=per_s(in_inside + out_inside),
        samples_per_s=per_s(samples),
        drain_s=max(0.0, max(ends) - end) if ends else 0.0,
        drain_requests=sum(1 for e in ends if e > end),
        drain_output_tokens=round(sum((r.output_tokens or 0) for r in records) - out_inside
                                  - sum(output_tokens_in(r, -math.inf, start) for r in records if r.output_tokens)),
        output_tokens=sum(r.output_tokens or 0 for r in records),
        input_tokens=sum(r.input_tokens or 0 for r in records),
        input_tokens_estimated=sum(1 for r in records if r.input_estimated),
        ttft_s=distribution(r.ttft for r in ok),
        tpot_s=distribution(r.tpot for r in ok),
        itl_s=distribution(gap for r in ok if r.chunk_times for gap in gaps(r.chunk_times)),
        e2e_s=distribution(r.e2e for r in ok),
        effective_e2e_s=distribution(effective_e2e(r) for r in ok),
        schedule_lag_s=distribution(r.lag for r in records),
    )
    for slo in slos:
        good = [i for i, r in enumerate(records) if is_good(r, slo)]
        summary.goodput_by_slo[slo.name] = {
            "good_requests": float(len(good)),
            "goodput_rps": per_s(math.fsum(share[i] for i in good)),
            "goodput_tokens_per_s": per_s(math.fsum(produced[i] for i in good)),
            "slo_attainment": len(good) / n if n else 0.0,
        }
    if slos:
        first = summary.goodput_by_slo[slos[0].name]
        summary.slo = slos[0].name
        summary.goodput_rps = first["goodput_rps"]
        summary.goodput_tokens_per_s = first["goodput_tokens_per_s"]
        summary.slo_attainment = first["slo_attainment"]
    else:  # no SLO: every successful request is good
        summary.goodput_rps = per_s(math.fsum(f for r, f in zip(records, share, strict=True) if not is_error(r)))
        summary.goodput_tokens_per_s = per_s(math.fsum(p for r, p in zip(records, produced, strict=True)
                                                        if not is_error(r)))
        summary.slo_attainment = len(ok) / n if n else None
    if planned is not None:
        _add_drift(summary, records, planned, input_floor)
    if cost_per_hour_usd is not None:
        add_cost(summary, cost_per_hour_usd)
    return summary


class _Drift(msgspec.Struct):
    mean: float | None  # token-weighted mean absolute relative drift
    off: int  # requests more than one token off
    worst: float | None


def _drift(pairs: list[tuple[int, int]]) -> _Drift:
    want_total = sum(w for w, _ in pairs)
    if not pairs or want_total <= 0:
        return _Drift(None, 0, None)
    worst = max((abs(g - w) / w for w, g in pairs if w > 0), default=None)
    return _Drift(sum(abs(g - w) for w, g in pairs) / want_total, sum(1 for w, g in pairs if abs(g - w) > 1), worst)


def _add_drift(summary: RunSummary, records: Sequence[RequestRecord], planned: Sequence[Planned],
               input_floor: int | None) -> None:
    """Drift of successful requests between planned and achieved lengths; unreachable plans apart."""
    ins: list[tuple[int, int]] = []
    outs: list[tuple[int, int]] = []
    unreachable = 0
    for plan, rec in zip(planned, records, strict=True):
        if is_error(rec):
            continue
        if plan.input_tokens is not None and input_floor is not None and plan.input_tokens < input_floor:
            unreachable += 1  # known before sending: also when the server reports no count (a stream without usage)
        elif plan.input_tokens is not None and rec.input_tokens is not None and not rec.input_estimated:
            ins.append((plan.input_tokens, rec.input_tokens))
        if plan.output_tokens is not None and rec.output_tokens is not None:
            outs.append((plan.output_tokens, rec.output_tokens))
    d_in, d_out = _drift(ins), _drift(outs)
    summary.input_token_drift, summary.input_drift_requests, summary.input_drift_worst = d_in.mean, d_in.off, d_in.worst
    summary.output_token_drift, summary.output_drift_requests, summary.output_drift_worst = (
        d_out.mean, d_out.off, d_out.worst)
    summary.unreachable_requests = unreachable


def add_cost(summary: RunSummary, cost_per_hour: float) -> None:
    """Cost per million output tokens and per 1,000 requests, raw and of good throughput."""
    per_s = cost_per_hour / 3600.0
    summary.cost_per_hour_usd = cost_per_hour

    def per_million(tok_per_s: float) -> float | None:
        return per_s / tok_per_s * 1e6 if tok_per_s > 0 else None

    def per_1k(req_per_s: float) -> float | None:
        return per_s / req_per_s * 1e3 if req_per_s > 0 else None

    summary.cost_per_million_output_tokens = per_million(summary.output_tokens_per_s)
    summary.cost_per_1k_requests = per_1k(summary.request_rate_rps)
    summary.goodput_cost_per_million_output_tokens = per_million(summary.goodput_tokens_per_s)
    summary.goodput_cost_per_1k_requests = per_1k(summary.goodput_rps)
