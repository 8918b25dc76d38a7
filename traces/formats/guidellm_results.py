"""guidellm's benchmark report (`guidellm run --output kind=json`, `benchmarks.json`) as slogate data:
one benchmark's aggregates mapped into the one summary's fields, its per-request stats as RequestRecords.

Pure parsing; never reads prompt or output text (`request_args`, `output`) nor error messages.
Where guidellm's definition differs from slogate's, DEFINITIONS says so (`slogate compare` prints it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson

from slogate.traces.metrics import Summary, tpot
from slogate.traces.record import RequestRecord
from slogate.traces.summary import RunSummary

REPORT_NAME = "benchmarks.json"
# slogate summary field -> (guidellm metric in benchmarks[K].metrics, scale to seconds). No itl_s:
# guidellm keeps only the first and last token times of a request, not its chunk gaps.
LATENCIES = {"ttft_s": ("time_to_first_token_ms", 1e-3), "tpot_s": ("inter_token_latency_ms", 1e-3),
             "e2e_s": ("request_latency", 1.0)}
DEFINITIONS = (
    "ttft_s = guidellm time_to_first_token_ms (request headers sent, after the connection is open → first "
    "chunk with output), as slogate's TTFT",
    "tpot_s = guidellm inter_token_latency_ms ((last − first token chunk) / (output tokens − 1)): slogate's "
    "TPOT, not its ITL; its distribution weights each request by output tokens − 1 (count = tokens), and its "
    "percentiles are order statistics, not interpolated",
    "itl_s: none (guidellm records no chunk gaps); guidellm's own time_per_output_token_ms includes the TTFT "
    "and is not shown",
    "e2e_s = guidellm request_latency (request headers sent → stream closed after [DONE]), as slogate's E2E",
    "request_rate_rps / output_tokens_per_s = guidellm requests_per_second / output_tokens_per_second means over "
    "the benchmark's duration (first request start → last request end; whole requests)",
    "goodput_rps / slo_attainment: successful requests (guidellm's errored and incomplete ones failed; no SLO)",
)


class GuidellmError(ValueError):
    """Not a guidellm report, or no such benchmark in it: the message names the file and the fix."""


def is_guidellm_report(obj: object) -> bool:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return isinstance(meta, dict) and "guidellm_version" in meta and isinstance(obj.get("benchmarks"), list)


def split_index(path: str | Path) -> tuple[Path, int | None]:
    """`benchmarks.json@2` → (benchmarks.json, 2): which benchmark of a multi-benchmark (sweep) report."""
    text = str(path)
    base, sep, index = text.rpartition("@")
    if sep and index.isdigit() and not Path(text).exists():
        return Path(base), int(index)
    return Path(text), None


def find_report(path: Path) -> Path | None:
    """The report file for a file or a directory holding `benchmarks.json`; None when there is none."""
    candidate = path / REPORT_NAME if path.is_dir() else path
    if not candidate.is_file() or candidate.suffix != ".json":
        return None
    try:
        obj = orjson.loads(candidate.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return candidate if is_guidellm_report(obj) else None


def read_benchmark(path: Path, index: int | None = None) -> tuple[dict, dict]:
    """(report, benchmark) of a guidellm report; `index` picks one benchmark of several."""
    try:
        report = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise GuidellmError(f"{path}: not readable as JSON ({exc})") from None
    if not is_guidellm_report(report):
        raise GuidellmError(f"{path}: not a guidellm benchmarks.json (no metadata.guidellm_version/benchmarks)")
    benchmarks = report["benchmarks"]
    if index is None:
        if len(benchmarks) != 1:
            raise GuidellmError(f"{path}: holds {len(benchmarks)} benchmarks; pick one as {path}@K, K in "
                                f"0..{len(benchmarks) - 1}")
        index = 0
    if not 0 <= index < len(benchmarks) or not isinstance(benchmarks[index], dict):
        raise GuidellmError(f"{path}@{index}: no such benchmark (it holds {len(benchmarks)}: use @0..@{len(benchmarks) - 1})")
    return report, benchmarks[index]


def _num(obj: object, *keys: str) -> float | None:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return float(obj) if isinstance(obj, int | float) else None


def read_records(benchmark: dict) -> list[RequestRecord]:
    """The benchmark's requests (successful, errored, incomplete), `t` from the first request start."""
    groups = benchmark.get("requests") or {}
    rows = [(status, r) for status in ("successful", "errored", "incomplete")
            for r in (groups.get(status) or []) if isinstance(r, dict) and _num(r, "info", "timings", "request_start")]
    if not rows:
        raise GuidellmError("no requests with timings in the benchmark (guidellm's per-request stats are missing)")
    rows.sort(key=lambda sr: _num(sr[1], "info", "timings", "request_start") or 0.0)
    t0 = _num(rows[0][1], "info", "timings", "request_start") or 0.0
    return [_record(status, r, t0) for status, r in rows]


def _tokens(row: dict, side: str) -> int | None:
    v = _num(row, side, "total_tokens")
    return int(v) if v is not None else None


def _record(status: str, row: dict, t0: float) -> RequestRecord:
    timings = row["info"]["timings"]
    start = float(timings["request_start"])
    first, end = _num(timings, "first_token_iteration"), _num(timings, "request_end")
    ttft = first - start if first is not None else None
    e2e = end - start if end is not None else None
    output = _tokens(row, "output_metrics")
    if output is None and isinstance(timings.get("token_iterations"), int) and timings["token_iterations"] > 0:
        output = timings["token_iterations"]  # guidellm's own fallback: one token per iteration
    per_request_itl = None
    last = _num(timings, "last_token_iteration")
    if first is not None and last is not None and output is not None and output > 1:
        per_request_itl = (last - first) / (output - 1)  # guidellm's inter_token_latency_ms / 1000
    return RequestRecord(
        t=start - t0,
        stream=first is not None,
        input_tokens=_tokens(row, "input_metrics"),
        output_tokens=output,
        ttft=ttft,
        tpot=per_request_itl if per_request_itl is not None else tpot(e2e, ttft, output),
        e2e=e2e,
        status=200 if status == "successful" else 0,
        error=None if status == "successful" else ("client_disconnect" if status == "incomplete" else "unknown"),  # type: ignore[arg-type]
    )


def _distribution(metric: object, scale: float) -> Summary:
    stats = metric.get("successful") if isinstance(metric, dict) else None
    if not isinstance(stats, dict) or not stats.get("count"):
        return Summary()

    def get(*keys: str) -> float | None:
        v = _num(stats, *keys)
        return v * scale if v is not None else None

    return Summary(count=int(stats["count"]), mean=get("mean"), p50=get("percentiles", "p50"),
                   p90=get("percentiles", "p90"), p95=get("percentiles", "p95"), p99=get("percentiles", "p99"),
                   p99_9=get("percentiles", "p999"), max=get("max"))


def aggregate_summary(benchmark: dict) -> RunSummary:
    """The benchmark's own aggregates in the one summary's fields (DEFINITIONS: where they differ)."""
    metrics = benchmark.get("metrics") or {}
    totals = metrics.get("request_totals") or {}
    ok = int(totals.get("successful") or 0)
    by_class = {cls: int(totals.get(key) or 0) for key, cls in (("errored", "unknown"), ("incomplete", "client_disconnect"))}
    by_class = {cls: n for cls, n in by_class.items() if n}
    failed = sum(by_class.values())
    rate = _num(metrics, "requests_per_second", "successful", "mean") or 0.0
    out_rate = _num(metrics, "output_tokens_per_second", "successful", "mean") or 0.0
    summary = RunSummary(
        requests=ok + failed,
        failed=failed,
        duration_s=_num(benchmark, "duration") or 0.0,
        request_rate_rps=rate,
        output_tokens_per_s=out_rate,
        total_tokens_per_s=_num(metrics, "tokens_per_second", "successful", "mean") or 0.0,
        samples_per_s=rate,
        goodput_rps=rate,  # successful requests only
        goodput_tokens_per_s=out_rate,
        slo_attainment=ok / (ok + failed) if ok + failed else None,
        output_tokens=round(_num(metrics, "output_token_count", "successful", "total_sum") or 0),
        input_tokens=round(_num(metrics, "prompt_token_count", "successful", "total_sum") or 0),
        **{field: _distribution(metrics.get(name), scale) for field, (name, scale) in LATENCIES.items()},
    )
    summary.failed_by_class = dict(sorted(by_class.items()))
    return summary


def models(report: dict, benchmark: dict) -> list[str]:
    for backend in ((benchmark.get("config") or {}).get("backend"), ((report.get("config") or {}).get("spec") or {}).get("backend")):
        if isinstance(backend, dict) and isinstance(backend.get("model"), str):
            return [backend["model"]]
    return []


def version(report: dict) -> str:
    return str((report.get("metadata") or {}).get("guidellm_version"))


def describe(lines: Iterable[str]) -> list[str]:
    return [f"guidellm: {line}" for line in lines]
