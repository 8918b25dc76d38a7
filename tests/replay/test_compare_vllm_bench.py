"""`slogate compare` reads `vllm bench serve --save-result --save-detailed` JSON (tests/fixtures/peers:
real vLLM 0.33.0 output, generated texts stripped) as a side: vLLM's own aggregates mapped into the
one summary, its per-request lists beside as records."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from slogate.cli import main as slogate
from slogate.replay.compare import CompareError, flatten, load_side
from slogate.traces.formats import vllm_bench_results as vb
from slogate.traces.summary import run_window, summarize
from tests.replay.test_compare_runs import make_trace, replay

RESULT = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "vllm-bench-0.33.0" / "vllm-bench-detailed.json"
MAPPED = {"ttft_s": "ttft", "tpot_s": "tpot", "itl_s": "itl", "e2e_s": "e2el"}
STATS = {"mean": "mean", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}  # run with --metric-percentiles 50,90,95,99


def _raw() -> dict:
    return orjson.loads(RESULT.read_bytes())


def _write(tmp_path: Path, obj: dict, name: str = "result.json") -> Path:
    path = tmp_path / name
    path.write_bytes(orjson.dumps(obj))
    return path


def test_fixture_is_vllm_bench_output_without_text() -> None:
    obj = _raw()
    assert "generated_texts" not in obj and obj["backend"] == "openai-chat" and obj["completed"] == 24
    assert len(obj["ttfts"]) == len(obj["itls"]) == len(obj["start_times"]) == 24 and not any(obj["errors"])
    assert "vllm-bench-0.33.0" in (RESULT.parents[1] / "README.md").read_text()


def test_compare_shows_vllms_own_aggregates() -> None:
    side = load_side(RESULT)
    assert side.kind == "vllm-bench" and side.results.environment.models == ["llama-3-8b"]
    assert side.results.environment.labels == {"tool": "vllm bench serve --backend openai-chat"}
    shown, obj = flatten(side.results.summary), _raw()
    for field, name in MAPPED.items():
        for stat, key in STATS.items():
            want = obj[f"{key}_{name}_ms"] * 1e-3
            assert math.isclose(shown[f"{field}.{stat}"], want, rel_tol=1e-9), (field, stat)  # type: ignore[arg-type]
        assert math.isclose(shown[f"{field}.p50"], obj[f"median_{name}_ms"] * 1e-3, rel_tol=1e-9)  # type: ignore[arg-type]
    for field, key in (("request_rate_rps", "request_throughput"), ("output_tokens_per_s", "output_throughput"),
                       ("total_tokens_per_s", "total_token_throughput"), ("duration_s", "duration")):
        assert shown[field] == obj[key], field
    assert (shown["requests"], shown["failed"], shown["slo_attainment"]) == (24, 0, 1.0)
    assert (shown["output_tokens"], shown["input_tokens"]) == (obj["total_output_tokens"], obj["total_input_tokens"])
    # count and max come from vLLM's own per-request lists
    assert shown["ttft_s.max"] == max(obj["ttfts"]) and shown["e2e_s.max"] == max(obj["latencies"])
    assert shown["itl_s.count"] == sum(len(g) for g in obj["itls"]) and shown["itl_s.max"] == max(max(g) for g in obj["itls"])
    assert any("tpot_s = vLLM tpot" in n and "excludes the first" in n for n in side.notes)


def test_mapping_claims_hold_on_vllms_own_requests() -> None:
    """The definitions, checked on the data: vLLM's per-request lists summarized by slogate give vLLM's
    own mean and percentiles of TTFT, TPOT, pooled ITL and E2EL (same formulas, numpy's linear
    percentiles); its rates are whole requests over the benchmark duration."""
    obj = _raw()
    records = vb.read_records(obj)
    assert records is not None and len(records) == 24 and records[0].t == 0.0
    assert obj["start_times"] == sorted(obj["start_times"])  # so the records keep the file's order
    assert [r.input_tokens for r in records] == obj["input_lens"]  # the server's usage.prompt_tokens
    assert all(r.output_tokens == 16 and r.error is None for r in records)
    own = flatten(summarize(records, window=run_window(records)))
    for field, name in MAPPED.items():
        for stat, key in STATS.items():
            assert math.isclose(own[f"{field}.{stat}"], obj[f"{key}_{name}_ms"] * 1e-3, rel_tol=1e-9), (field, stat)  # type: ignore[arg-type]
    assert math.isclose(obj["request_throughput"], 24 / obj["duration"], rel_tol=1e-12)
    assert max(r.t + r.e2e for r in records if r.e2e is not None) < obj["duration"]  # the window ends after the last token


def test_compare_shows_vllm_bench_beside_a_slogate_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = replay(make_trace(tmp_path / "t.jsonl.zst", rate=10.0, seconds=2.0), tmp_path / "run")
    assert slogate(["compare", str(run), str(RESULT), str(RESULT.parent), "--fail-if", "ttft_s.p99<0"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:1].isalpha()}
    for metric in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "itl_s.p50", "e2e_s.p99"):
        values = rows[metric]
        assert values[0] != "–" and values[1] != "–" and values[4] != "–", (metric, values)
    assert "vllm bench: itl_s = vLLM itl" in out
    assert f"{RESULT} (vllm bench serve result)" in out


def test_a_result_without_save_detailed_shows_the_aggregates_only(tmp_path: Path) -> None:
    obj = _raw()
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "errors"):
        del obj[key]
    for name in MAPPED.values():
        for p in ("50", "90", "95"):
            del obj[f"p{p}_{name}_ms"]  # vLLM's default --metric-percentiles is 99 only
    side = load_side(_write(tmp_path, obj))
    shown = flatten(side.results.summary)
    assert side.records is None
    assert shown["ttft_s.p50"] == pytest.approx(obj["median_ttft_ms"] * 1e-3, rel=1e-9)
    assert shown["ttft_s.p99"] == pytest.approx(obj["p99_ttft_ms"] * 1e-3, rel=1e-9)
    assert shown["ttft_s.p90"] is None and shown["ttft_s.max"] is None and shown["ttft_s.count"] == 0


def test_vllm_failed_requests_count_as_failed_and_their_messages_are_not_read(tmp_path: Path) -> None:
    obj = _raw()
    obj["errors"][3] = "SECRET-MESSAGE"
    obj["ttfts"][3], obj["latencies"][3], obj["itls"][3], obj["output_lens"][3] = 0.0, 0.0, [], 0
    obj["completed"], obj["failed"] = 23, 1
    side = load_side(_write(tmp_path, obj))
    agg = side.results.summary
    assert (agg.requests, agg.failed, agg.failed_by_class) == (24, 1, {"unknown": 1})
    assert agg.slo_attainment == pytest.approx(23 / 24) and agg.ttft_s.count == 23
    assert side.records is not None and [r.error for r in side.records].count("unknown") == 1
    assert "SECRET-MESSAGE" not in repr(side)


def test_a_result_dir_with_two_results_and_an_appended_file_are_one_line_errors(tmp_path: Path) -> None:
    obj = _raw()
    _write(tmp_path, obj, "a.json")
    _write(tmp_path, obj, "b.json")
    with pytest.raises(CompareError, match=r"holds 2 vllm bench results \(a\.json, b\.json\); give one file"):
        load_side(tmp_path)
    appended = tmp_path / "appended.json"
    appended.write_bytes(orjson.dumps(obj) + b"\n" + orjson.dumps(obj))
    with pytest.raises(CompareError, match=r"appended\.json: holds 2 vllm bench results, one per line \(--append-result\); "
                                           r"give one as its own file, e\.g\. sed -n 1p .*appended\.json > one\.json"):
        load_side(appended)
