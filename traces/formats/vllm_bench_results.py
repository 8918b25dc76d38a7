"""`vllm bench serve --save-result` JSON as slogate data: its aggregates (mean/median/pNN of TTFT, TPOT,
ITL, E2EL; throughputs over the benchmark duration) mapped into the one summary's fields, and with
`--save-detailed` its per-request lists (ttfts, itls, latencies, start_times, …) as RequestRecords.

Pure parsing; never reads `generated_texts` nor the text of `errors` (only whether one is empty).
Where vLLM's definition differs from slogate's, DEFINITIONS says so (`slogate compare` prints it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import orjson

from slogate.traces.metrics import Summary, itl_summary, tpot
from slogate.traces.record import RequestRecord
from slogate.traces.summary import RunSummary

# slogate summary field -> vLLM metric name in `{mean,median,pNN}_{name}_ms`
LATENCIES = {"ttft_s": "ttft", "tpot_s": "tpot", "itl_s": "itl", "e2e_s": "e2el"}
PERCENTILE_FIELDS = {"p50": "50", "p90": "90", "p95": "95", "p99": "99", "p99_9": "99.9"}  # vLLM's `p{P}_…_ms`
REQUIRED = ("backend", "duration", "completed", "request_throughput", "output_throughput")
DEFINITIONS = (
    "ttft_s = vLLM ttft (before the POST, connection included → first chunk carrying output; a role-only "
    "chunk does not count), as slogate's TTFT",
    "tpot_s = vLLM tpot ((latency − TTFT) / (output_len − 1), requests of ≥ 2 tokens; excludes the first "
    "token), as slogate's TPOT",
    "itl_s = vLLM itl (every gap between output chunks, pooled over requests: `itls += output.itl`), as "
    "slogate's ITL",
    "e2e_s = vLLM e2el (request start → last output chunk; the usage chunk and [DONE] not counted): slogate's "
    "E2E ends at [DONE]",
    "p50/p90/p95/p99/p99_9 = vLLM's np.percentile (linear, as slogate) for the --metric-percentiles it was "
    "run with (p50: its median); count and max from its per-request lists (--save-detailed), else none",
    "request_rate_rps / output_tokens_per_s = vLLM request_throughput / output_throughput: whole requests "
    "over the benchmark duration (first send → every request done); slogate counts the offered window",
    "goodput_rps / slo_attainment: vLLM request_goodput when run with --goodput (its SLOs), else successful "
    "requests; failed requests (a non-empty error) are class unknown; with --goodput vLLM gives no goodput "
    "tokens/s (shown as 0)",
)


class VllmBenchError(ValueError):
    """Not a `vllm bench serve` result file: the message names the file and the fix."""


def is_vllm_bench_result(obj: object) -> bool:
    return isinstance(obj, dict) and all(k in obj for k in REQUIRED) and "mean_ttft_ms" in obj


def find_result(path: Path) -> Path | None:
    """The result file for a file, or a --result-dir holding one; None when there is none."""
    if path.is_dir():
        found = sorted(p for p in path.glob("*.json") if _looks_result(p))
        if len(found) > 1:
            raise VllmBenchError(f"{path}: holds {len(found)} vllm bench results ({', '.join(p.name for p in found)}); "
                                 "give one file")
        return found[0] if found else None
    if path.suffix != ".json" or not path.is_file():
        return None
    if _looks_result(path):
        return path
    lines = _appended(path)
    if lines:
        raise VllmBenchError(f"{path}: holds {lines} vllm bench results, one per line (--append-result); give "
                             f"one as its own file, e.g. sed -n 1p {path} > one.json")
    return None


def _looks_result(path: Path) -> bool:
    try:
        return is_vllm_bench_result(orjson.loads(path.read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return False


def _appended(path: Path) -> int:
    """How many results a file written with --append-result holds (0: not such a file)."""
    try:
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        return len(lines) if len(lines) > 1 and all(is_vllm_bench_result(orjson.loads(x)) for x in lines) else 0
    except (OSError, orjson.JSONDecodeError):
        return 0


def read_result(path: Path) -> dict:
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise VllmBenchError(f"{path}: not readable as JSON ({exc})") from None
    if not is_vllm_bench_result(obj):
        raise VllmBenchError(f"{path}: not a vllm bench serve --save-result file (no {'/'.join(REQUIRED)}/mean_ttft_ms)")
    return obj


def _num(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _list(obj: dict, key: str, n: int) -> list:
    v = obj.get(key)
    return v if isinstance(v, list) and len(v) == n else [None] * n


def read_records(obj: dict) -> list[RequestRecord] | None:
    """Per-request records from a --save-detailed file (None without its lists), in start order,
    `t` from the first start (vLLM's start_times are perf_counter seconds)."""
    starts = obj.get("start_times")
    if not isinstance(starts, list) or not starts or not all(isinstance(s, int | float) for s in starts):
        return None
    n = len(starts)
    columns = zip(starts, _list(obj, "ttfts", n), _list(obj, "itls", n), _list(obj, "latencies", n),
                  _list(obj, "input_lens", n), _list(obj, "output_lens", n), _list(obj, "errors", n), strict=True)
    t0 = min(starts)
    records = [_record(t0, *row) for row in columns]
    records.sort(key=lambda r: r.t)
    return records


def _record(t0: float, start: float, ttft: object, gaps: object, latency: object, input_len: object,
            output_len: object, error: object) -> RequestRecord:
    failed = bool(error)  # the message itself (a server's reason or an exception) is never read
    ok_ttft = float(ttft) if not failed and isinstance(ttft, int | float) else None
    e2e = float(latency) if not failed and isinstance(latency, int | float) else None
    output = int(output_len) if isinstance(output_len, int) and not failed else None
    chunk_times = None
    if ok_ttft is not None and isinstance(gaps, list) and all(isinstance(g, int | float) for g in gaps):
        chunk_times, at = [ok_ttft], ok_ttft
        for g in gaps:
            at += g
            chunk_times.append(at)
    return RequestRecord(
        t=start - t0,
        input_tokens=int(input_len) if isinstance(input_len, int) else None,
        output_tokens=output,
        ttft=ok_ttft,
        tpot=tpot(e2e, ok_ttft, output),
        e2e=e2e,
        itl=itl_summary(gaps) if chunk_times is not None else None,  # type: ignore[arg-type]
        chunk_times=chunk_times,
        status=0 if failed else 200,
        error="unknown" if failed else None,
    )


def _distribution(obj: dict, name: str, values: list[float] | None) -> Summary:
    mean = _num(obj, f"mean_{name}_ms")
    if mean is None:
        return Summary()
    ms = {field: _num(obj, f"p{p}_{name}_ms") for field, p in PERCENTILE_FIELDS.items()}
    if ms["p50"] is None:
        ms["p50"] = _num(obj, f"median_{name}_ms")
    stats = {field: v * 1e-3 for field, v in ms.items() if v is not None}
    count, top = (len(values), max(values)) if values else (0, None)
    return Summary(count=count, mean=mean * 1e-3, max=top, **stats)


def _per_request(obj: dict) -> dict[str, list[float] | None]:
    """vLLM's own per-request samples behind each aggregate (for count and max), as calculate_metrics
    takes them: successful requests' ttft and latency, tpot of those with ≥ 2 tokens, every pooled gap."""
    records = read_records(obj)
    if records is None:
        return dict.fromkeys(LATENCIES)
    n = len(records)
    ok = [i for i, e in enumerate(_list(obj, "errors", n)) if not e]
    itls = _list(obj, "itls", n)
    return {"ttft_s": _floats(_list(obj, "ttfts", n), ok), "e2e_s": _floats(_list(obj, "latencies", n), ok),
            "tpot_s": [r.tpot for r in records if r.tpot is not None],
            "itl_s": [float(g) for i in ok if isinstance(itls[i], list) for g in itls[i]]}


def _floats(values: list, keep: list[int]) -> list[float]:
    return [float(values[i]) for i in keep if isinstance(values[i], int | float)]


def aggregate_summary(obj: dict) -> RunSummary:
    """vLLM's own aggregates in the one summary's fields (DEFINITIONS: where they differ)."""
    ok, failed = int(_num(obj, "completed") or 0), int(_num(obj, "failed") or 0)
    duration = _num(obj, "duration") or 0.0
    rate = _num(obj, "request_throughput") or 0.0
    out_rate = _num(obj, "output_throughput") or 0.0
    goodput = _num(obj, "request_goodput")
    good = goodput * duration if goodput is not None else ok
    samples = _per_request(obj)
    summary = RunSummary(
        requests=ok + failed,
        failed=failed,
        duration_s=duration,
        request_rate_rps=rate,
        output_tokens_per_s=out_rate,
        total_tokens_per_s=_num(obj, "total_token_throughput") or 0.0,
        samples_per_s=rate,
        goodput_rps=goodput if goodput is not None else rate,
        goodput_tokens_per_s=out_rate if goodput is None else 0.0,
        slo_attainment=min(1.0, good / (ok + failed)) if ok + failed and math.isfinite(good) else None,
        output_tokens=int(_num(obj, "total_output_tokens") or 0),
        input_tokens=int(_num(obj, "total_input_tokens") or 0),
        **{field: _distribution(obj, name, samples[field]) for field, name in LATENCIES.items()},
    )
    summary.failed_by_class = {"unknown": failed} if failed else {}
    return summary


def models(obj: dict) -> list[str]:
    model = obj.get("model_id")
    return [model] if isinstance(model, str) else []


def tool(obj: dict) -> str:
    """The result file names no vLLM version; its backend says which client code measured."""
    return f"vllm bench serve --backend {obj.get('backend')}"


def describe(lines: Iterable[str]) -> list[str]:
    return [f"vllm bench: {line}" for line in lines]
