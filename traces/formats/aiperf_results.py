"""AIPerf's result files as slogate data: `profile_export.jsonl` (one record per request) as
RequestRecords, `profile_export_aiperf.json` (aggregates) mapped into the one summary's fields.

Pure parsing; never reads prompt or response text (AIPerf's exports hold none) nor error messages.
Where AIPerf's definition differs from slogate's, DEFINITIONS says so (`slogate compare` prints it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson

from slogate.traces.metrics import Summary, tpot
from slogate.traces.record import RequestRecord
from slogate.traces.summary import RunSummary

AGGREGATE_GLOB = "profile_export*.json"
RECORDS_NAME = "profile_export.jsonl"
# AIPerf metric -> slogate summary field, for the aggregate file (all AIPerf latencies are in ms).
LATENCIES = {"ttft_s": "time_to_first_token", "tpot_s": "inter_token_latency", "itl_s": "inter_chunk_latency",
             "e2e_s": "request_latency"}
DEFINITIONS = (
    "ttft_s = AIPerf time_to_first_token (request sent → first response chunk with output), as slogate's TTFT",
    "tpot_s = AIPerf inter_token_latency ((request_latency − TTFT) / (output tokens − 1)): slogate's TPOT, "
    "not its ITL",
    "itl_s = AIPerf inter_chunk_latency (gaps between consecutive response chunks; chunks read together are 0 "
    "apart); slogate's ITL pools the gaps between output-bearing chunks",
    "e2e_s = AIPerf request_latency (request sent → last response byte), as slogate's E2E",
    "request_rate_rps / output_tokens_per_s = AIPerf request_throughput / output_token_throughput over its "
    "benchmark_duration (whole requests; slogate counts each request by the share of its output in the window)",
    "goodput_rps / slo_attainment: successful requests (no SLO: AIPerf's aggregate file has no per-request "
    "times to judge one; give profile_export.jsonl for SLO goodput)",
)
RECORDS_DEFINITIONS = (
    "computed by slogate from AIPerf's per-request times (profile_export.jsonl): slogate's definitions, "
    "window = first send → last completion (closed loop)",
)


class AiperfError(ValueError):
    """Not an AIPerf export: the message names the file and what was expected."""


def is_aiperf_aggregate(obj: object) -> bool:
    return isinstance(obj, dict) and "aiperf_version" in obj and isinstance(obj.get("time_to_first_token"), dict)


def find_files(path: Path) -> tuple[Path | None, Path | None]:
    """(aggregate JSON, per-request JSONL) for a file or an artifact directory; None where absent."""
    if path.is_dir():
        aggregates = sorted(p for p in path.glob(AGGREGATE_GLOB) if _looks_aggregate(p))
        records = path / RECORDS_NAME
        return (aggregates[0] if aggregates else None), (records if records.is_file() else None)
    if path.name.endswith(".jsonl"):
        agg = sorted(p for p in path.parent.glob(AGGREGATE_GLOB) if _looks_aggregate(p))
        return (agg[0] if agg else None), path
    records = path.parent / RECORDS_NAME
    return path, (records if records.is_file() else None)


def _looks_aggregate(path: Path) -> bool:
    try:
        return is_aiperf_aggregate(orjson.loads(path.read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return False


def read_aggregate(path: Path) -> dict:
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise AiperfError(f"{path}: not readable as JSON ({exc})") from None
    if not is_aiperf_aggregate(obj):
        raise AiperfError(f"{path}: not an AIPerf profile_export_aiperf.json (no aiperf_version/time_to_first_token)")
    return obj


def read_records(path: Path) -> list[RequestRecord]:
    """The profiling-phase requests of a `profile_export.jsonl`, `t` from the first send (seconds)."""
    rows: list[dict] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise AiperfError(f"{path}: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AiperfError(f"{path}:{n}: not JSON (expected AIPerf's profile_export.jsonl)") from None
        meta = row.get("metadata") if isinstance(row, dict) else None
        if not isinstance(meta, dict) or "request_start_ns" not in meta:
            raise AiperfError(f"{path}:{n}: no metadata.request_start_ns (expected AIPerf's profile_export.jsonl)")
        if meta.get("benchmark_phase", "profiling") == "profiling":
            rows.append(row)
    if not rows:
        raise AiperfError(f"{path}: no profiling-phase requests")
    t0 = min(int(r["metadata"]["request_start_ns"]) for r in rows)
    return [_record(r, t0) for r in sorted(rows, key=lambda r: int(r["metadata"]["request_start_ns"]))]


def _value(metrics: dict, name: str) -> object:
    m = metrics.get(name)
    return m.get("value") if isinstance(m, dict) else None


def _ms(metrics: dict, name: str) -> float | None:
    v = _value(metrics, name)
    return float(v) / 1000.0 if isinstance(v, int | float) else None


def _int(metrics: dict, *names: str) -> int | None:
    for name in names:
        v = _value(metrics, name)
        if isinstance(v, int | float):
            return int(v)
    return None


def _record(row: dict, t0_ns: int) -> RequestRecord:
    meta, metrics = row["metadata"], row.get("metrics") or {}
    start = int(meta["request_start_ns"])
    end = meta.get("request_end_ns")
    ttft = _ms(metrics, "time_to_first_token")
    e2e = _ms(metrics, "request_latency")
    if e2e is None and isinstance(end, int):
        e2e = (end - start) * 1e-9
    output = _int(metrics, "output_sequence_length", "usage_completion_tokens")
    gaps = _value(metrics, "inter_chunk_latency")
    chunk_times = None
    if ttft is not None and isinstance(gaps, list) and all(isinstance(g, int | float) for g in gaps):
        chunk_times, at = [ttft], ttft
        for g in gaps:
            at += g / 1000.0
            chunk_times.append(at)
    error = row.get("error")
    status, cls = 200, None
    if isinstance(error, dict) or meta.get("was_cancelled"):
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) and 100 <= code <= 599 else 0
        cls = "upstream_status" if status >= 400 else ("client_disconnect" if meta.get("was_cancelled") else "unknown")
    return RequestRecord(
        t=(start - t0_ns) * 1e-9,
        stream=ttft is not None,
        input_tokens=_int(metrics, "input_sequence_length", "usage_prompt_tokens"),
        output_tokens=output,
        ttft=ttft,
        tpot=tpot(e2e, ttft, output),
        e2e=e2e,
        chunk_times=chunk_times,
        status=status,
        error=cls,  # type: ignore[arg-type]
        session=str(meta["conversation_id"]) if meta.get("conversation_id") is not None else None,
        turn=meta.get("turn_index") if isinstance(meta.get("turn_index"), int) else None,
    )


def _distribution(stats: object, scale: float) -> Summary:
    if not isinstance(stats, dict):
        return Summary()

    def get(key: str) -> float | None:
        v = stats.get(key)
        return float(v) * scale if isinstance(v, int | float) else None

    count = stats.get("count")
    return Summary(count=int(count) if isinstance(count, int | float) else 0, mean=get("avg"), p50=get("p50"),
                   p90=get("p90"), p95=get("p95"), p99=get("p99"), max=get("max"))


def _avg(obj: dict, name: str) -> float | None:
    m = obj.get(name)
    v = m.get("avg") if isinstance(m, dict) else None
    return float(v) if isinstance(v, int | float) else None


def aggregate_summary(obj: dict) -> RunSummary:
    """The aggregate file's numbers in the one summary's fields (DEFINITIONS: where they differ)."""
    by_class: dict[str, int] = {}
    for e in obj.get("error_summary") or []:  # [{"error_details": {"code", "type", "message"}, "count"}]
        if isinstance(e, dict) and isinstance(e.get("count"), int):
            code = (e.get("error_details") or {}).get("code")
            cls = "upstream_status" if isinstance(code, int) and code >= 400 else "unknown"
            by_class[cls] = by_class.get(cls, 0) + e["count"]
    failed = sum(by_class.values())
    ok = round(_avg(obj, "completed_request_count") or _avg(obj, "request_count") or 0)
    total = ok + failed
    rate = _avg(obj, "request_throughput") or 0.0
    summary = RunSummary(
        requests=total,
        failed=failed,
        duration_s=_avg(obj, "benchmark_duration") or 0.0,
        request_rate_rps=rate,
        output_tokens_per_s=_avg(obj, "output_token_throughput") or 0.0,
        total_tokens_per_s=_avg(obj, "total_token_throughput") or 0.0,
        samples_per_s=rate,  # one sample per (non-embeddings) request, as slogate counts them
        goodput_rps=rate,  # request_throughput counts completed requests only
        goodput_tokens_per_s=_avg(obj, "output_token_throughput") or 0.0,
        slo_attainment=ok / total if total else None,
        output_tokens=round(_avg(obj, "total_osl") or _avg(obj, "total_output_tokens") or 0),
        input_tokens=round(_avg(obj, "total_isl") or 0),
        **{field: _distribution(obj.get(name), 1e-3) for field, name in LATENCIES.items()},
    )
    summary.failed_by_class = dict(sorted(by_class.items()))
    return summary


def models(obj: dict) -> list[str]:
    items = ((obj.get("input_config") or {}).get("models") or {}).get("items") or []
    return [str(m["name"]) for m in items if isinstance(m, dict) and "name" in m]


def describe(lines: Iterable[str]) -> list[str]:
    return [f"aiperf: {line}" for line in lines]
