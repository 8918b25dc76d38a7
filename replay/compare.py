"""Compare runs: load each side (a run's results.json, or a captured trace summarized the same way)
with its per-request records, flatten every summary metric, compute deltas against the first side
with bootstrap confidence intervals (replay.significance) and check `--fail-if` bounds.

Pure apart from reading the inputs; never writes files and never prints (replay.cli.compare does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.replay.measure import offered_rate
from slogate.replay.results import Environment, Results, load
from slogate.replay.significance import PER_REQUEST, STATS, bootstrap_deltas, significant
from slogate.traces.metrics import Summary
from slogate.traces.record import RequestRecord
from slogate.traces.segments import TraceError
from slogate.traces.slo import Slo, SloError, parse_slo
from slogate.traces.summary import RunSummary, run_window, summarize

SUMMARY_STATS = tuple(f.name for f in msgspec.structs.fields(Summary))  # count, mean, p50, …, max
TABLE_STATS = ("p50", "p90", "p99", "max", "mean")  # the stats the side-by-side table shows
BOUND_TOLERANCE = 1e-9  # a --fail-if change this close (relatively) to its bound counts as equal to it
# Which way is better, for colouring deltas: larger for these, no verdict for the NEUTRAL ones
# (they describe the run's setup), smaller for everything else (latencies, failures, drift, cost).
HIGHER_IS_BETTER = ("request_rate_rps", "output_tokens_per_s", "total_tokens_per_s", "samples_per_s",
                    "goodput", "slo_attainment")
NEUTRAL = ("requests", "duration_s", "window_start_s", "offered_rate_rps", "send_rate_rps", "lag_bound_s",
           "warmup_requests", "cost_per_hour_usd", "input_tokens", "output_tokens", "input_tokens_estimated")

FAIL_IF_GRAMMAR = (
    "METRIC OP BOUND, OP one of < <= > >=; BOUND '+10%'/'-5%' (relative change vs the baseline), "
    "'+0.05'/'-2' (signed: absolute change, '+20ms' allowed) or '0.9' (unsigned: the value itself); "
    "METRIC a summary field like goodput_rps, slo_attainment or ttft_s.p99; a trailing '!' "
    "('ttft_s.p99>+10%!') breaks only when the change is also significant (bootstrap CI excludes 0)"
)
_FAIL_IF = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_.\-]*)\s*(?P<op><=|>=|<|>)\s*"
    r"(?P<sign>[+-])?(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>%|ms|us|s)?\s*(?P<sig>!)?\s*$"
)


class CompareError(ValueError):
    """A user mistake (missing input, bad --fail-if): the message names the bad value and the fix."""


class Side(msgspec.Struct):
    """One column of the comparison."""

    name: str
    source: str
    kind: str  # "run" (results.json), "trace" (captured trace summarized like a run, over its offered window) or a peer ("aiperf", "guidellm", "vllm-bench")
    results: Results
    records: list[RequestRecord] | None = None  # per-request records (None: none beside the results)
    notes: list[str] = []  # how a peer's metric definitions map onto slogate's


class Bound(msgspec.Struct, frozen=True):
    """A parsed `--fail-if`: breaks when the measured quantity `op` `value` holds."""

    text: str
    metric: str
    op: str
    value: float
    mode: str  # "relative" (fraction), "absolute" (change in the metric's unit) or "value"
    significant: bool = False  # '!': also require the change to exceed the bootstrap CI


class Violation(msgspec.Struct):
    bound: str
    side: str
    metric: str
    measured: float | None  # the relative change, absolute change or value that broke the bound
    mode: str
    message: str


# -- loading -----------------------------------------------------------------------------------------


def load_side(path: str | Path, *, slos: Sequence[Slo] = (), name: str | None = None) -> Side:
    """A run directory / results.json, or a slogate trace file or capture directory."""
    p = Path(path)
    label = name or _default_name(p)
    peer = guidellm_side(p, label)  # before the existence check: `benchmarks.json@K` names one benchmark
    if peer is not None:
        return peer
    if not p.exists():
        raise CompareError(f"{p}: no such file or directory (give a run directory, a results.json or a slogate trace)")
    peer = aiperf_side(p, label, slos) or vllm_bench_side(p, label)
    if peer is not None:
        return peer
    results_file = p / "results.json" if p.is_dir() else p
    if results_file.name.endswith(".json") and results_file.is_file():
        try:
            results = load(results_file)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CompareError(f"{results_file}: not a slogate results.json ({exc})") from None
        return Side(name=label, source=str(p), kind="run", results=results,
                    records=run_records(results_file.parent / "requests.jsonl.zst"))
    results, records = summarize_trace(p, slos=slos, with_records=True)
    return Side(name=label, source=str(p), kind="trace", results=results, records=records)


def aiperf_side(p: Path, label: str, slos: Sequence[Slo] = ()) -> Side | None:
    """An AIPerf export (artifact directory, profile_export*.json or profile_export.jsonl) as a side;
    None when `p` is not one. A .jsonl is summarized by slogate over its per-request records; a
    directory or .json shows AIPerf's own aggregates (definitions mapped), with the records beside."""
    from slogate.traces.formats import aiperf_results as ap

    aggregate, jsonl = ap.find_files(p)
    obj = None
    if aggregate is not None:
        try:
            obj = ap.read_aggregate(aggregate)
        except ap.AiperfError:
            obj = None
    if (p.is_dir() and obj is None and jsonl is None) or (p.suffix == ".json" and obj is None):
        return None  # not AIPerf's (a results.json, a run directory)
    if p.is_file() and p.suffix not in (".json", ".jsonl"):
        return None
    try:
        records = ap.read_records(jsonl) if jsonl is not None else None
    except ap.AiperfError as exc:
        if p.suffix == ".jsonl":
            return None  # some other JSONL (a Mooncake or agentic trace)
        raise CompareError(str(exc)) from None
    env = Environment(target="aiperf", models=ap.models(obj) if obj else [],
                      labels={"tool": f"aiperf {obj.get('aiperf_version')}"} if obj else {})
    if obj is not None and p.suffix != ".jsonl":
        summary, notes = ap.aggregate_summary(obj), ap.describe(ap.DEFINITIONS)
    else:
        assert records is not None
        summary = summarize(records, window=run_window(records), slos=slos)
        notes = ap.describe(ap.RECORDS_DEFINITIONS)
    return Side(name=label, source=str(p), kind="aiperf", results=Results(environment=env, summary=summary),
                records=records, notes=notes)


def guidellm_side(p: Path, label: str) -> Side | None:
    """A guidellm report (`benchmarks.json`, a directory holding one, or `benchmarks.json@K` for one
    benchmark of a sweep) as a side: guidellm's own aggregates (definitions mapped), its per-request
    stats beside as records; None when `p` is not one."""
    from slogate.traces.formats import guidellm_results as gl

    file, index = gl.split_index(p)
    report_file = gl.find_report(file)
    if report_file is None:
        return None
    try:
        report, benchmark = gl.read_benchmark(report_file, index)
        records = gl.read_records(benchmark)
    except gl.GuidellmError as exc:
        raise CompareError(f"{report_file}: {exc}" if not str(exc).startswith(str(report_file)) else str(exc)) from None
    env = Environment(target="guidellm", models=gl.models(report, benchmark),
                      labels={"tool": f"guidellm {gl.version(report)}"})
    return Side(name=label, source=str(p), kind="guidellm",
                results=Results(environment=env, summary=gl.aggregate_summary(benchmark)),
                records=records, notes=gl.describe(gl.DEFINITIONS))


def vllm_bench_side(p: Path, label: str) -> Side | None:
    """A `vllm bench serve --save-result` file (or a --result-dir holding one) as a side: vLLM's own
    aggregates (definitions mapped), its per-request lists (--save-detailed) beside as records; None
    when `p` is not one."""
    from slogate.traces.formats import vllm_bench_results as vb

    try:
        result_file = vb.find_result(p)
        if result_file is None:
            return None
        obj = vb.read_result(result_file)
    except vb.VllmBenchError as exc:
        raise CompareError(str(exc)) from None
    records = vb.read_records(obj)
    env = Environment(target="vllm-bench", models=vb.models(obj), labels={"tool": vb.tool(obj)})
    return Side(name=label, source=str(p), kind="vllm-bench",
                results=Results(environment=env, summary=vb.aggregate_summary(obj)),
                records=records, notes=vb.describe(vb.DEFINITIONS))


def run_records(path: Path) -> list[RequestRecord] | None:
    """A run's per-request records (requests.jsonl.zst beside results.json); None when absent/unreadable."""
    if not path.is_file():
        return None
    from slogate.traces.reader import read_trace

    try:
        return read_trace(path).records
    except TraceError:
        return None


def summarize_trace(path: str | Path, *, slos: Sequence[Slo] = (), with_records: bool = False):  # type: ignore[no-untyped-def]
    """Summarize a captured trace like a run: the same summary, over its offered window (the arrivals
    are the schedule a replay of it offers, so a candidate that keeps up reports the same rates).

    Uses `slos` when given, else the SLOs recorded in the trace header."""
    from slogate.traces.reader import read_trace

    try:
        trace = read_trace(path)
    except TraceError as exc:
        raise CompareError(f"{exc} (expected a run directory, a results.json or a slogate trace)") from None
    if not trace.records:
        raise CompareError(f"{path}: the trace holds no requests")
    if not slos and trace.header.slos:
        try:
            slos = [parse_slo(spec, default_name=name) for name, spec in trace.header.slos.items()]
        except SloError:
            slos = []
    summary = summarize(trace.records, slos=slos, offered_rate_rps=offered_rate(trace.records))
    env = Environment(
        target=f"trace:{trace.header.source or 'capture'}",
        trace=str(path),
        slogate_version=trace.header.slogate_version,
        start_unix=trace.header.start_unix,
        slo={s.name: s.spec() for s in slos},
    )
    results = Results(environment=env, summary=summary)
    return (results, trace.records) if with_records else results


def slos_of(results: Results) -> list[Slo]:
    """The SLOs a run was measured with (so a trace side can use the same ones)."""
    out: list[Slo] = []
    for name, spec in results.environment.slo.items():
        try:
            out.append(parse_slo(spec, default_name=name))
        except SloError:
            continue
    if results.summary.slo:  # the goodput SLO first
        out.sort(key=lambda s: s.name != results.summary.slo)
    return out


def _default_name(p: Path) -> str:
    if p.name == "results.json":
        p = p.parent
    if p.name == "requests.jsonl.zst":  # a run's own records used as a trace
        return f"{p.parent.name}/requests"
    name = p.name or str(p)
    for suffix in (".jsonl.zst", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


# -- metrics -----------------------------------------------------------------------------------------


def flatten(summary: RunSummary) -> dict[str, float | None]:
    """Every numeric summary metric by path: scalars, `X.stat` of each Summary, `goodput_by_slo.NAME.key`."""
    out: dict[str, float | None] = {}
    for field in msgspec.structs.fields(RunSummary):
        value = getattr(summary, field.name)
        if isinstance(value, Summary):
            for stat in SUMMARY_STATS:
                v = getattr(value, stat)
                out[f"{field.name}.{stat}"] = None if v is None else float(v)
        elif field.name == "goodput_by_slo":
            for slo_name, numbers in value.items():
                for key, v in numbers.items():
                    out[f"goodput_by_slo.{slo_name}.{key}"] = float(v)
        elif field.name == "failed_by_class":
            for cls, n in value.items():
                out[f"failed_by_class.{cls}"] = float(n)
        elif isinstance(value, bool):
            out[field.name] = float(value)
        elif (value is None or isinstance(value, int | float)) and field.name not in ("slo",):
            out[field.name] = None if value is None else float(value)
    return out


def table_metrics(flat_by_side: Sequence[dict[str, float | None]]) -> list[str]:
    """The rows of the side-by-side table: scalars and the TABLE_STATS of each distribution, in order,
    leaving out metrics no side has (e.g. cost without --cost-per-hour)."""
    keys: list[str] = []
    for flat in flat_by_side:
        for key in flat:
            stat = key.rsplit(".", 1)[-1]
            if "." in key and not key.startswith("goodput_by_slo.") and stat not in TABLE_STATS:
                continue
            if key not in keys:
                keys.append(key)
    return [k for k in keys if any(f.get(k) is not None for f in flat_by_side)]


def better_direction(metric: str) -> int:
    """+1 when larger is better, -1 when smaller is better, 0 when a change is neither."""
    if metric in NEUTRAL or metric.endswith(".count"):
        return 0
    return 1 if any(metric.startswith(p) or p in metric.split(".") for p in HIGHER_IS_BETTER) else -1


def deltas(base: float | None, value: float | None) -> tuple[float | None, float | None]:
    """(absolute, relative) change of `value` vs `base`; relative is ±inf from a zero baseline."""
    if base is None or value is None:
        return None, None
    diff = value - base
    if base == 0:
        return diff, 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff, diff / abs(base)


# -- --fail-if ---------------------------------------------------------------------------------------


def parse_bound(text: str, known: Sequence[str], *, repeats: bool = False) -> Bound:
    """Parse one `--fail-if` expression; `known` are the metric paths available. With `repeats`
    (`compare --repeat N`: every metric has a CI from the repeats) '!' goes with any metric."""
    m = _FAIL_IF.match(text)
    if not m:
        raise CompareError(f"bad --fail-if {text!r}: expected {FAIL_IF_GRAMMAR}")
    metric, unit, sign = m["metric"], m["unit"], m["sign"]
    if metric not in known:
        close = [k for k in known if k.split(".")[0] == metric.split(".")[0]][:8]
        hint = f"; did you mean one of: {', '.join(close)}" if close else f"; known metrics include {', '.join(list(known)[:12])}, …"
        raise CompareError(f"bad --fail-if {text!r}: unknown metric {metric!r}{hint}")
    if unit == "%" and not sign:
        raise CompareError(f"bad --fail-if {text!r}: a percentage is a change against the baseline and needs its "
                           f"sign ('{metric}{m['op']}+{m['num']}%' or '{metric}{m['op']}-{m['num']}%'); for the value "
                           f"itself write a plain number ('{metric}{m['op']}{float(m['num']) / 100:g}')")
    value = float(m["num"]) * (-1.0 if sign == "-" else 1.0)
    sig = bool(m["sig"])
    stat = metric.rsplit(".", 1)[-1]
    if sig and not repeats and metric.split(".")[0] in PER_REQUEST and stat not in STATS:
        raise CompareError(f"bad --fail-if {text!r}: '!' needs a percentile or the mean ({', '.join(STATS)}): the "
                           f"bootstrap gives {stat!r} no interval; e.g. '{metric.rsplit('.', 1)[0]}.p99_9"
                           f"{m['op']}{m['sign'] or ''}{m['num']}{unit or ''}!', or --repeat N")
    if sig and ((metric.split(".")[0] not in PER_REQUEST and not repeats) or not (unit == "%" or sign)):
        raise CompareError(f"bad --fail-if {text!r}: '!' (significance) needs a change ('+10%', '+20ms') of a "
                           f"per-request latency ({', '.join(PER_REQUEST)}), e.g. 'ttft_s.p99>+10%!', or "
                           "--repeat N for any metric")
    if unit == "%":
        return Bound(text=text, metric=metric, op=m["op"], value=value / 100.0, mode="relative", significant=sig)
    if unit in ("ms", "us", "s"):
        value *= {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
    return Bound(text=text, metric=metric, op=m["op"], value=value, mode="absolute" if sign else "value",
                 significant=sig)


def intervals(sides: Sequence[Side], *, seed: int = 0, resamples: int | None = None) -> list[dict[str, tuple[float, float]] | None]:
    """Per non-baseline side: the bootstrap CI of each latency stat's change vs the baseline (None
    when either side has no per-request records)."""
    base = sides[0].records
    out: list[dict[str, tuple[float, float]] | None] = []
    for side in sides[1:]:
        if not base or not side.records:
            out.append(None)
            continue
        kw = {"resamples": resamples} if resamples else {}
        out.append(bootstrap_deltas(base, side.records, seed=seed, **kw))
    return out


def check(bounds: Sequence[Bound], sides: Sequence[Side],
          cis: Sequence[dict[str, tuple[float, float]] | None] | None = None) -> list[Violation]:
    """Check every bound on every side after the first (the baseline); a missing value breaks the bound.
    A '!' bound breaks only when the change is also significant (`cis` from `intervals`)."""
    flats = [flatten(s.results.summary) for s in sides]
    base = flats[0]
    out: list[Violation] = []
    if cis is None and any(b.significant for b in bounds):
        cis = intervals(sides)
    for bound in bounds:
        for i, (side, flat) in enumerate(zip(sides[1:], flats[1:], strict=True)):
            value = flat.get(bound.metric)
            absolute, relative = deltas(base.get(bound.metric), value)
            measured = {"relative": relative, "absolute": absolute, "value": value}[bound.mode]
            if measured is None:
                out.append(Violation(bound.text, side.name, bound.metric, None, bound.mode,
                                     _no_value(bound, side.name, sides[0].name, value)))
            elif _holds(measured, bound.op, bound.value):
                if bound.significant:
                    ci = (cis[i] or {}).get(bound.metric) if cis is not None else None
                    if ci is None:
                        out.append(Violation(bound.text, side.name, bound.metric, measured, bound.mode,
                                             f"{side.name}: {bound.text!r}: no per-request records on both sides "
                                             "to test significance (requests.jsonl.zst)"))
                        continue
                    if not significant(ci):
                        continue  # the change is within run-to-run noise
                out.append(Violation(bound.text, side.name, bound.metric, measured, bound.mode,
                                     f"{side.name}: {bound.text!r} broken: {_describe(bound, measured, value)}"))
    return out


def _holds(x: float, op: str, bound: float) -> bool:
    """`x op bound`, where a change equal to the bound up to float rounding is equal: 3 → 1.8 is −40 %
    even though (1.8 − 3) / 3 is −0.39999999999999997 ('<=-40%' breaks, '<-40%' holds)."""
    if math.isclose(x, bound, rel_tol=BOUND_TOLERANCE, abs_tol=1e-12):
        x = bound
    return {"<": x < bound, "<=": x <= bound, ">": x > bound, ">=": x >= bound}[op]


def _no_value(bound: Bound, side: str, baseline: str, value: float | None) -> str:
    """Why a bound had nothing to check: the side's own value is missing, or (a change) the baseline's."""
    if value is not None and bound.mode != "value":
        return f"{side}: the baseline {baseline} has no {bound.metric} to check the change {bound.text!r} against"
    return f"{side}: {bound.metric} has no value to check {bound.text!r} against"


def _describe(bound: Bound, measured: float, value: float | None) -> str:
    if bound.mode == "relative":
        return f"{bound.metric} changed {measured * 100:+.2f}% vs the baseline (now {value:.6g})"
    if bound.mode == "absolute":
        return f"{bound.metric} changed {measured:+.6g} vs the baseline (now {value:.6g})"
    return f"{bound.metric} is {measured:.6g}"


# -- the whole comparison as data (for --json and the table) ----------------------------------------


def mismatches(sides: Sequence[Side]) -> list[str]:
    """What makes the sides' numbers differ by definition rather than by performance: runs (or traces
    summarized with them) judged under different SLOs, runs that replayed different traces. One line each."""
    runs = [s for s in sides if s.kind in ("run", "trace")]
    out = []
    slos = {s.name: ", ".join(f"{k}: {v}" for k, v in sorted(s.results.environment.slo.items())) for s in runs}
    if len(set(slos.values())) > 1:
        shown = "; ".join(f"{name} {spec or 'none'}" for name, spec in slos.items())
        out.append(f"the sides were judged under different SLOs ({shown}): SLO attainment and goodput differ by "
                   "definition, not by performance")
    digests = {s.name: s.results.environment.trace_digest for s in runs if s.kind == "run"}
    if len({d for d in digests.values() if d}) > 1:
        out.append("the runs replayed different traces (trace_digest differs): their load was not the same")
    else:
        out += _workload_mismatch([s for s in runs if s.kind == "run"])
    # A replay keeps the chunk times its in-window throughput needs (those of requests crossing the window's
    # end); a capture has them only with --trace-chunk-times.
    bare = [s.name for s in runs if s.kind == "trace" and s.records and not any(r.chunk_times for r in s.records)]
    if bare and any(s.kind == "run" for s in runs):
        out.append(f"{', '.join(bare)}: records without chunk times (a capture without --trace-chunk-times), so "
                   "in-window throughput spreads each request's tokens evenly from TTFT to E2E where the replays "
                   "count every chunk at its time; under a changing load the two differ (by 10-20 % in an overload)")
    return out


def _workload_mismatch(runs: Sequence[Side]) -> list[str]:
    """Runs that offered different workloads (source and transforms: --rate, --speed, --window, --duration,
    --max-requests, …): their rates, counts and latencies differ by the load, not only by the setup."""
    shown = {s.name: " → ".join(s.results.environment.workload) for s in runs if s.results.environment.workload}
    if len(shown) < 2 or len(set(shown.values())) < 2:
        return []
    return [f"the runs offered different workloads ({'; '.join(f'{n}: {w}' for n, w in shown.items())}): requests, "
            "rates and latencies differ by the load, not only by the setup"]


def comparison(sides: Sequence[Side], metrics: Sequence[str] | None = None,
               cis: Sequence[dict[str, tuple[float, float]] | None] | None = None) -> dict[str, object]:
    """`compare --json`: per metric the values, deltas, relative deltas and, per non-baseline side, the
    bootstrap CI of the change (`ci`, null where there is none) and whether it excludes 0 (`significant`)."""
    flats = [flatten(s.results.summary) for s in sides]
    cis = list(cis) if cis is not None else [None] * (len(sides) - 1)
    keys = list(metrics) if metrics is not None else list(dict.fromkeys(k for f in flats for k in f))
    rows: dict[str, object] = {}
    for key in keys:
        values = [f.get(key) for f in flats]
        pairs = [deltas(values[0], v) for v in values[1:]]
        rows[key] = {
            "values": values,
            "delta": [p[0] for p in pairs],
            "relative": [_json_float(p[1]) for p in pairs],
            "ci": [list(c[key]) if c and key in c else None for c in cis],
            "significant": [significant(c[key]) if c and key in c else None for c in cis],
        }
    return {
        "baseline": sides[0].name,
        "sides": [{"name": s.name, "source": s.source, "kind": s.kind,
                   "labels": s.results.environment.labels, "degraded": s.results.summary.degraded} for s in sides],
        "metrics": rows,
        "warnings": mismatches(sides),
    }


def _json_float(x: float | None) -> float | str | None:
    if x is not None and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x
