"""The result of one replay run: `results.json` schema (versioned) and its summary computation.

`summarize_run(records, ...)` turns per-request records into the `Summary` every output format
(console, CSV, HTML, compare, sweep) reads. Pure: no I/O here except `load`/`dump`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from slogate.traces.metrics import Summary, summarize
from slogate.traces.record import RequestRecord, effective_e2e, is_error
from slogate.traces.slo import Slo, is_good

RESULTS_SCHEMA_VERSION = 1
_S = TypeVar("_S", bound=msgspec.Struct)


class Environment(msgspec.Struct, omit_defaults=True):
    """Where and how the run happened (never an API key)."""

    target: str = ""
    models: list[str] = []  # from the target's /v1/models
    server_version: str | None = None  # from /version when offered
    labels: dict[str, str] = {}  # --label gpu=H100 --label framework=vllm-0.11
    trace: str | None = None  # trace file name
    trace_digest: str | None = None  # sha256 of the trace file(s)
    seed: int | None = None
    command: list[str] = []
    slogate_version: str = ""
    start_unix: float = 0.0
    endpoint: str = "/v1/chat/completions"
    stream: bool = True
    output_forcing: str | None = None  # "ignore_eos", "min_tokens", "logit_bias", "none"
    tokenizer: str | None = None  # "server:/tokenize", "file:…", "calibrated"
    slo: dict[str, str] = {}  # name -> spec
    shard: str | None = None  # "i/N" for a distributed replay shard
    # added by the replay engine (additive):
    server_kind: str | None = None  # vllm, sglang, llamacpp, slogate-sim, unknown
    clock: str = "real"  # "real" (HTTP, wall clock) or "virtual" (simulator API, no HTTP)
    workload: list[str] = []  # source then transforms, e.g. ["trace:x.csv", "window=0:600", "speed=10"]
    request_timeout_s: float | None = None
    retries: int | None = None  # retries before any response byte (connect error, 429/502/503)
    workers: int | None = None  # sending processes
    shards: list[str] = []  # merged runs: the shard specs combined


class RunSummary(msgspec.Struct, omit_defaults=False):
    """The headline numbers of a run. Throughputs use the run's measured duration."""

    requests: int = 0
    failed: int = 0
    duration_s: float = 0.0
    request_rate_rps: float = 0.0
    offered_rate_rps: float | None = None
    output_tokens_per_s: float = 0.0
    total_tokens_per_s: float = 0.0
    samples_per_s: float = 0.0
    goodput_rps: float = 0.0
    goodput_tokens_per_s: float = 0.0
    slo_attainment: float | None = None
    slo: str | None = None  # name of the SLO goodput uses
    goodput_by_slo: dict[str, dict[str, float]] = {}  # name -> {goodput_rps, goodput_tokens_per_s, slo_attainment}
    ttft_s: Summary = msgspec.field(default_factory=Summary)
    tpot_s: Summary = msgspec.field(default_factory=Summary)
    itl_s: Summary = msgspec.field(default_factory=Summary)
    e2e_s: Summary = msgspec.field(default_factory=Summary)
    effective_e2e_s: Summary = msgspec.field(default_factory=Summary)
    schedule_lag_s: Summary = msgspec.field(default_factory=Summary)
    input_token_drift: float | None = None
    output_token_drift: float | None = None
    degraded: bool = False
    degraded_reasons: list[str] = []
    # added by the replay engine (additive):
    send_rate_rps: float | None = None  # requests actually sent per second (vs offered_rate_rps)
    lag_bound_s: float | None = None  # the schedule-lag p99 bound that marks a run degraded
    warmup_requests: int = 0  # sent before the measured requests and excluded from every figure
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM: in-flight requests drained then cancelled, the rest not sent
    planned_requests: int | None = None  # interrupted runs: requests in the schedule (warmup included; None: closed loop for a duration)
    sent_requests: int | None = None  # interrupted runs: requests sent (= requests + warmup_requests)
    cancelled_requests: int | None = None  # interrupted runs: sent but cancelled after the drain (status 499, error "interrupted")
    not_sent_requests: int | None = None  # interrupted runs: planned_requests − sent_requests
    cost_per_hour_usd: float | None = None
    cost_per_million_output_tokens: float | None = None
    cost_per_1k_requests: float | None = None
    goodput_cost_per_million_output_tokens: float | None = None
    goodput_cost_per_1k_requests: float | None = None


class Results(msgspec.Struct, omit_defaults=False):
    """`results.json`."""

    schema_version: int = RESULTS_SCHEMA_VERSION
    environment: Environment = msgspec.field(default_factory=Environment)
    summary: RunSummary = msgspec.field(default_factory=RunSummary)
    point: dict[str, float] = {}  # sweep point (speed / rate / concurrency) when part of a sweep


def summarize_run(
    records: Sequence[RequestRecord],
    *,
    duration_s: float,
    slos: Sequence[Slo] = (),
    planned: Sequence[tuple[int | None, int | None]] | None = None,
    offered_rate_rps: float | None = None,
    cost_per_hour_usd: float | None = None,
) -> RunSummary:
    """Summary of a run. `planned` holds (input_tokens, output_tokens) per record, for drift."""
    n = len(records)
    duration = max(duration_s, 1e-9)
    ok = [r for r in records if not is_error(r)]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.input_tokens or 0 for r in ok)
    samples = sum(r.n_inputs or 1 for r in ok)
    itl = [gap for r in ok for gap in _itl_gaps(r)]
    summary = RunSummary(
        requests=n,
        failed=n - len(ok),
        duration_s=duration_s,
        request_rate_rps=n / duration,
        offered_rate_rps=offered_rate_rps,
        output_tokens_per_s=out_tokens / duration,
        total_tokens_per_s=(in_tokens + out_tokens) / duration,
        samples_per_s=samples / duration,
        ttft_s=summarize(r.ttft for r in ok),
        tpot_s=summarize(r.tpot for r in ok),
        itl_s=summarize(itl),
        e2e_s=summarize(r.e2e for r in ok),
        effective_e2e_s=summarize(effective_e2e(r) for r in ok),
        schedule_lag_s=summarize(r.lag for r in records),
    )
    for slo in slos:
        good = [r for r in records if is_good(r, slo)]
        summary.goodput_by_slo[slo.name] = {
            "goodput_rps": len(good) / duration,
            "goodput_tokens_per_s": sum(r.output_tokens or 0 for r in good) / duration,
            "slo_attainment": len(good) / n if n else 0.0,
        }
    if slos:
        first = summary.goodput_by_slo[slos[0].name]
        summary.slo = slos[0].name
        summary.goodput_rps = first["goodput_rps"]
        summary.goodput_tokens_per_s = first["goodput_tokens_per_s"]
        summary.slo_attainment = first["slo_attainment"]
    else:
        summary.goodput_rps = len(ok) / duration
        summary.goodput_tokens_per_s = out_tokens / duration
        summary.slo_attainment = len(ok) / n if n else None
    if planned is not None:
        summary.input_token_drift = _drift([p[0] for p in planned], [r.input_tokens for r in records], records)
        summary.output_token_drift = _drift([p[1] for p in planned], [r.output_tokens for r in records], records)
    if cost_per_hour_usd is not None:
        _add_cost(summary, cost_per_hour_usd)
    return summary


def _itl_gaps(record: RequestRecord) -> list[float]:
    """Every inter-token gap of a request: exact from chunk times, else its mean repeated."""
    times = record.chunk_times
    if times and len(times) > 1:
        return [b - a for a, b in itertools.pairwise(times)]
    if record.itl is not None:
        return [record.itl.mean] * record.itl.count
    return []


def _drift(planned: Sequence[int | None], achieved: Sequence[int | None], records: Sequence[RequestRecord]) -> float | None:
    """Max relative difference between planned and achieved lengths over successful requests."""
    worst: float | None = None
    for want, got, rec in zip(planned, achieved, records, strict=True):
        if want is None or got is None or is_error(rec) or want == 0:
            continue
        d = abs(got - want) / want
        worst = d if worst is None else max(worst, d)
    return worst


def _add_cost(summary: RunSummary, cost_per_hour: float) -> None:
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


def write_json(obj: msgspec.Struct, path: str | Path) -> None:
    """Indented JSON of a struct (results.json, sweep.json)."""
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(obj), indent=2) + b"\n")


def read_json(path: str | Path, type_: type[_S], name: str) -> _S:
    """Read a struct from a JSON file, or from the file `name` inside a directory."""
    p = Path(path)
    if p.is_dir():
        p = p / name
    return msgspec.json.decode(p.read_bytes(), type=type_)


def dump(results: Results, path: str | Path) -> None:
    write_json(results, path)


def load(path: str | Path) -> Results:
    """Read a results.json (a directory holding one is accepted too)."""
    return read_json(path, Results, "results.json")


def is_finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
