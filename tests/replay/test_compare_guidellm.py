"""`slogate compare` reads guidellm's report (tests/fixtures/peers: real guidellm 0.8.1 output) as a
side: its own aggregates mapped into the one summary, its per-request stats beside as records."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from slogate.cli import main as slogate
from slogate.replay.compare import CompareError, flatten, load_side
from slogate.traces.formats import guidellm_results as gl
from slogate.traces.summary import run_window, summarize
from tests.replay.test_compare_runs import make_trace, replay

REPORT = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "guidellm-0.8.1" / "benchmarks.json"
# slogate field -> (guidellm metric, scale to seconds); the stats compare shows
MAPPED = {"ttft_s": ("time_to_first_token_ms", 1e-3), "tpot_s": ("inter_token_latency_ms", 1e-3),
          "e2e_s": ("request_latency", 1.0)}
STATS = {"mean": ("mean",), "p50": ("percentiles", "p50"), "p90": ("percentiles", "p90"),
         "p99": ("percentiles", "p99"), "max": ("max",)}


def _raw() -> dict:
    return orjson.loads(REPORT.read_bytes())


def _get(obj: dict, keys: tuple[str, ...]) -> float:
    for k in keys:
        obj = obj[k]
    return float(obj)  # type: ignore[arg-type]


def test_fixture_is_guidellm_output_without_text() -> None:
    report = _raw()
    assert report["metadata"]["guidellm_version"] == "0.8.1" and len(report["benchmarks"]) == 1
    assert "guidellm-0.8.1" in (REPORT.parents[1] / "README.md").read_text()
    requests = report["benchmarks"][0]["requests"]["successful"]
    assert len(requests) == 24 and all(r["request_args"] is None and r["output"] is None for r in requests)


def test_compare_shows_guidellms_own_aggregates() -> None:
    side = load_side(REPORT)
    assert side.kind == "guidellm" and side.results.environment.models == ["llama-3-8b"]
    assert side.results.environment.labels == {"tool": "guidellm 0.8.1"}
    shown = flatten(side.results.summary)
    bench = _raw()["benchmarks"][0]
    metrics = bench["metrics"]
    for field, (name, scale) in MAPPED.items():
        for stat, keys in STATS.items():
            want = _get(metrics[name]["successful"], keys) * scale
            assert math.isclose(shown[f"{field}.{stat}"], want, rel_tol=1e-9), (field, stat)  # type: ignore[arg-type]
    for field, name in (("request_rate_rps", "requests_per_second"), ("output_tokens_per_s", "output_tokens_per_second"),
                        ("total_tokens_per_s", "tokens_per_second")):
        assert math.isclose(shown[field], metrics[name]["successful"]["mean"], rel_tol=1e-9), field  # type: ignore[arg-type]
    assert shown["duration_s"] == bench["duration"] and shown["requests"] == 24 and shown["failed"] == 0
    assert shown["output_tokens"] == 768 and shown["itl_s.p50"] is None  # guidellm records no chunk gaps
    assert any("inter_token_latency_ms" in n and "TPOT" in n for n in side.notes)


def test_mapping_claims_hold_on_guidellms_own_requests() -> None:
    """The definitions, checked on the data: guidellm's per-request TTFT / ITL / latency summarized by
    slogate give guidellm's means and maxima; its percentiles are order statistics (the ⌈q·n⌉-th value),
    which slogate's interpolated ones bracket; its rates are whole requests over first start → last end."""
    report = _raw()
    bench = report["benchmarks"][0]
    records = gl.read_records(bench)
    assert len(records) == 24 and records[0].t == 0.0
    assert all(r.output_tokens == 32 and r.error is None and r.input_tokens for r in records)
    own = flatten(summarize(records, window=run_window(records)))
    metrics = bench["metrics"]
    for field, (name, scale) in MAPPED.items():
        agg = metrics[name]["successful"]
        assert math.isclose(own[f"{field}.mean"], agg["mean"] * scale, rel_tol=1e-9), field  # type: ignore[arg-type]
        assert math.isclose(own[f"{field}.max"], agg["max"] * scale, rel_tol=1e-9), field  # type: ignore[arg-type]
        values = sorted(getattr(r, field.removesuffix("_s")) for r in records)
        for q, key in ((0.5, "p50"), (0.9, "p90")):
            assert math.isclose(agg["percentiles"][key] * scale, values[math.ceil(q * len(values)) - 1], rel_tol=1e-9)
    assert math.isclose(metrics["requests_per_second"]["successful"]["mean"], 24 / bench["duration"], rel_tol=1e-9)
    end = max(r.t + r.e2e for r in records if r.e2e is not None)
    assert math.isclose(end, bench["duration"], rel_tol=1e-9)


def test_compare_shows_guidellm_beside_a_slogate_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = replay(make_trace(tmp_path / "t.jsonl.zst", rate=10.0, seconds=2.0), tmp_path / "run")
    assert slogate(["compare", str(run), str(REPORT), str(REPORT.parent), "--fail-if", "ttft_s.p99<0"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:1].isalpha()}
    for metric in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "e2e_s.p99"):
        values = rows[metric]
        assert values[0] != "–" and values[1] != "–" and values[4] != "–", (metric, values)
    assert "guidellm: tpot_s = guidellm inter_token_latency_ms" in out
    assert f"{REPORT} (guidellm report)" in out


def test_a_sweep_report_needs_the_benchmark_named(tmp_path: Path) -> None:
    report = _raw()
    second = orjson.loads(orjson.dumps(report["benchmarks"][0]))
    second["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]["p50"] = 99.0
    report["benchmarks"].append(second)
    path = tmp_path / "benchmarks.json"
    path.write_bytes(orjson.dumps(report))
    with pytest.raises(CompareError, match=r"holds 2 benchmarks; pick one as .*benchmarks\.json@K, K in 0\.\.1"):
        load_side(path)
    assert flatten(load_side(f"{path}@1").results.summary)["ttft_s.p50"] == pytest.approx(0.099)
    with pytest.raises(CompareError, match=r"@5: no such benchmark \(it holds 2: use @0\.\.@1\)"):
        load_side(f"{path}@5")


def test_guidellm_errored_and_incomplete_requests_count_as_failed(tmp_path: Path) -> None:
    report = _raw()
    bench = report["benchmarks"][0]
    ok = bench["requests"]["successful"]
    bench["requests"]["errored"] = [{**ok[3], "info": {**ok[3]["info"], "error": "SECRET-MESSAGE"}}]
    bench["requests"]["incomplete"] = [ok[5]]
    bench["requests"]["successful"] = [r for i, r in enumerate(ok) if i not in (3, 5)]
    bench["metrics"]["request_totals"] = {"successful": 22, "errored": 1, "incomplete": 1, "total": 24}
    (tmp_path / "benchmarks.json").write_bytes(orjson.dumps(report))
    side = load_side(tmp_path)
    agg = side.results.summary
    assert (agg.requests, agg.failed, agg.failed_by_class) == (24, 2, {"client_disconnect": 1, "unknown": 1})
    assert agg.slo_attainment == pytest.approx(22 / 24)
    assert side.records is not None
    assert sorted(r.error for r in side.records if r.error) == ["client_disconnect", "unknown"]
    assert "SECRET-MESSAGE" not in repr(side)
