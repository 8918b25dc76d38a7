"""Trace statistics: a pure function from records to the numbers `slogate trace stats` prints.

The shape of the load (span, mean rate, inter-arrival CV, token mean/p50/p99, prefix reuse: share of
prompt blocks whose id already appeared earlier; ideal prefix reuse; sessions, turns, think time and
context growth) plus the one summary of `traces.summary` (latency,
throughput, goodput, failures), exactly as every other surface computes it. Never reads files.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import msgspec

from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord, TraceHeader, is_error
from slogate.traces.request_info import BYTES_PER_TOKEN
from slogate.traces.slo import Slo
from slogate.traces.summary import RunSummary, summarize

MAX_SPAN_S = 366 * 86400.0  # no trace of LLM traffic spans more than a year: a later arrival is a wrong unit


def arrival_rate(times: Sequence[float]) -> float | None:
    """The one mean rate of a schedule, requests/s: (n − 1) / (last − first), the arrivals' intervals over
    their span, so `replay --rate R` makes exactly R and `trace stats` reads R back; None below two
    distinct times. (n / span would read 2 req/s for two requests a second apart.)"""
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else None


class TokenStats(msgspec.Struct):
    mean: float | None = None
    p50: float | None = None
    p99: float | None = None


class TraceStats(msgspec.Struct):
    """JSON keys of `slogate trace stats --json`."""

    requests: int
    duration_s: float
    mean_rps: float | None
    interarrival_cv: float | None
    input_tokens: TokenStats
    output_tokens: TokenStats
    prefix_reuse: float | None  # null when no record has hash ids
    errors: int = 0  # failed requests (non-2xx, error class, abnormal finish)
    input_estimated: int = 0  # records whose input_tokens is the gateway's estimate (no usage was sent)
    summary: RunSummary | None = None  # the one summary (traces.summary) over the trace's offered window
    ideal_prefix_reuse: float | None = None  # share of prompt tokens that are a prefix of an earlier request
    sessions: SessionStats | None = None  # traces whose records carry sessions (agentic, multi-turn)


class SessionStats(msgspec.Struct):
    """Sessions of a trace: how many, how long, how long users/tools think, how fast contexts grow."""

    sessions: int
    subagents: int  # sessions with a parent session
    turns_per_session: TokenStats
    think_s: TokenStats  # think time of every turn after a session's first
    context_growth_tokens: TokenStats  # input tokens of turn k minus turn k−1 of the same session


def _tokens(values: list[int]) -> TokenStats:
    if not values:
        return TokenStats()
    values.sort()
    return TokenStats(mean=math.fsum(values) / len(values), p50=percentile(values, 50.0), p99=percentile(values, 99.0))


def trace_stats(records: Iterable[RequestRecord], slos: Sequence[Slo] = (), *,
                block_tokens: int | None = None) -> TraceStats:
    """Statistics of records given in arrival order (ties keep their order for prefix reuse).
    `block_tokens`: tokens per hash id (`block_tokens(header)`), for the ideal prefix reuse."""
    records = records if isinstance(records, list) else list(records)
    times = [r.t for r in records]
    inputs = [r.input_tokens for r in records if r.input_tokens is not None]
    outputs = [r.output_tokens for r in records if r.output_tokens is not None]
    errors = sum(1 for r in records if is_error(r))
    seen: set[int] = set()
    blocks = reused = 0
    for ids in [r.hash_ids for r in records if r.hash_ids]:
        before = len(seen)
        seen.update(ids)
        blocks += len(ids)
        reused += len(ids) - (len(seen) - before)  # ids already seen, earlier in this request included
    n = len(times)
    if any(a > b for a, b in itertools.pairwise(times)):
        times.sort()
    duration = times[-1] - times[0] if n else 0.0
    return TraceStats(
        requests=n,
        duration_s=duration,
        mean_rps=arrival_rate(times),
        interarrival_cv=_cv([b - a for a, b in itertools.pairwise(times)]),
        input_tokens=_tokens(inputs),
        output_tokens=_tokens(outputs),
        prefix_reuse=reused / blocks if blocks else None,
        errors=errors,
        input_estimated=sum(1 for r in records if r.input_estimated),
        summary=summarize(records, slos=slos) if records else None,
        ideal_prefix_reuse=ideal_prefix_reuse(records, block_tokens),
        sessions=session_stats(records),
    )


def block_tokens(header: TraceHeader) -> int:
    """Tokens per prefix block: the header's block size, converted from bytes when needed (a gateway
    capture without a tokenizer hashes 256-byte blocks: 64 tokens, as the replay builds them)."""
    if header.block_unit == "tokens":
        return max(1, header.block_size)
    return max(1, header.block_size // BYTES_PER_TOKEN)


def ideal_prefix_reuse(records: Sequence[RequestRecord], block_tokens: int | None = None) -> float | None:
    """Share of prompt tokens (in arrival order) that are a prefix of an earlier request: the hit rate
    of an infinite prefix cache. A request whose first k blocks continue an earlier request's block
    sequence from its start reuses min(k × block_tokens, input_tokens) tokens: the tokens after its
    last matching full block (the partial block at each turn's end) are new, as in a prefix cache
    (vLLM: matched full blocks × block size). Blocks are compared as sequences, so chained ids
    (captures) and plain per-block ids (agentic imports) both count. Without `block_tokens` (unknown
    block size) each id stands for an equal share of the prompt."""
    seen: set[int] = set()
    total = reused = 0.0
    for r in records:
        if not r.hash_ids or not r.input_tokens:
            continue
        prefixes, h, k = [], 0, 0
        for hid in r.hash_ids:
            h = hash((h, hid))
            prefixes.append(h)
        while k < len(prefixes) and prefixes[k] in seen:
            k += 1
        seen.update(prefixes)
        total += r.input_tokens
        size = block_tokens if r.block_size is None or block_tokens is None else r.block_size
        reused += r.input_tokens * k / len(prefixes) if size is None else min(k * size, r.input_tokens)
    return reused / total if total else None


def session_stats(records: Sequence[RequestRecord]) -> SessionStats | None:
    by: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.session is not None:
            by.setdefault(r.session, []).append(r)
    if not by:
        return None
    thinks, growth = [], []
    for turns in by.values():
        turns.sort(key=lambda r: (r.turn if r.turn is not None else 0, r.t))
        for prev, r in itertools.pairwise(turns):
            if r.think is not None:
                thinks.append(r.think)
            if r.input_tokens is not None and prev.input_tokens is not None:
                growth.append(r.input_tokens - prev.input_tokens)
    return SessionStats(
        sessions=len(by), subagents=sum(1 for t in by.values() if t[0].parent_session is not None),
        turns_per_session=_tokens([len(t) for t in by.values()]), think_s=_tokens(thinks),
        context_growth_tokens=_tokens(growth),
    )


def implausible_arrival(times: Sequence[float]) -> tuple[int, float, float] | None:
    """(position, t, first t) of the first arrival more than MAX_SPAN_S after the earliest one: a timestamp in
    the wrong unit (ms read as s) or an absolute epoch time among offsets. None when the span is plausible."""
    finite = [t for t in times if math.isfinite(t)]
    if not finite:
        return None
    first = min(finite)
    return next(((i, t, first) for i, t in enumerate(times) if math.isfinite(t) and t - first > MAX_SPAN_S), None)


def span_text(seconds: float) -> str:
    """A long span in the unit a reader takes in at once: `53.9 years`, `3 days`, `5.2 h`."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400.0), ("h", 3600.0)):
        if seconds >= size:
            return f"{seconds / size:,.3g} {unit}" if seconds / size < 1e6 else f"{seconds / size:.2e} {unit}"
    return f"{seconds:.3g} s"


def _cv(gaps: list[float]) -> float | None:
    """Coefficient of variation (population std / mean) of the inter-arrival gaps."""
    if len(gaps) < 2:
        return None
    mean = math.fsum(gaps) / len(gaps)
    if mean <= 0:
        return None
    var = math.fsum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(var) / mean
