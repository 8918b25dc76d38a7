"""`slogate compare` reads AIPerf's exports (tests/fixtures/peers: real AIPerf 0.13.0 output) as sides:
its aggregates mapped into the one summary, or its per-request records summarized by slogate."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import orjson
import pytest

from slogate.cli import main as slogate
from slogate.replay.compare import CompareError, aiperf_side, flatten, load_side
from slogate.traces.formats import aiperf_results as ap
from tests.replay.test_compare_runs import make_trace, replay

AIPERF = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "aiperf-0.13.0"
AGGREGATE = AIPERF / "profile_export_aiperf.json"
RECORDS = AIPERF / "profile_export.jsonl"
STATS = ("mean", "p50", "p90", "p99", "max")


def test_fixture_is_aiperf_output() -> None:
    obj = orjson.loads(AGGREGATE.read_bytes())
    assert obj["aiperf_version"] == "0.13.0" and obj["is_complete"] is True
    assert "aiperf-0.13.0" in (AIPERF.parent / "README.md").read_text()


def test_records_carry_aiperfs_per_request_numbers() -> None:
    rows = [orjson.loads(line) for line in RECORDS.read_bytes().splitlines()]
    by_start = sorted(rows, key=lambda r: r["metadata"]["request_start_ns"])
    records = ap.read_records(RECORDS)
    assert len(records) == len(rows) == 24
    assert records[0].t == 0.0 and all(a.t <= b.t for a, b in itertools.pairwise(records))
    for rec, row in zip(records, by_start, strict=True):
        m = row["metrics"]
        assert rec.ttft == pytest.approx(m["time_to_first_token"]["value"] / 1000)
        assert rec.e2e == pytest.approx(m["request_latency"]["value"] / 1000)
        # AIPerf's "inter_token_latency" is slogate's TPOT: (E2E − TTFT) / (tokens − 1).
        assert rec.tpot == pytest.approx(m["inter_token_latency"]["value"] / 1000, rel=1e-9)
        assert rec.chunk_times is not None and len(rec.chunk_times) == len(m["inter_chunk_latency"]["value"]) + 1
        assert rec.output_tokens == 32 and rec.error is None


def test_aggregate_mapping_matches_slogates_own_summary_of_the_records() -> None:
    """The mapping's claims, checked on the data: AIPerf's aggregate TTFT / ITL (as tpot_s) /
    inter-chunk latency (as itl_s) / request latency equal slogate's summary of the same requests."""
    agg = flatten(aiperf_side(AGGREGATE, "agg").results.summary)  # type: ignore[union-attr]
    own = flatten(aiperf_side(RECORDS, "own").results.summary)  # type: ignore[union-attr]
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        for stat in STATS:
            a, b = agg[f"{metric}.{stat}"], own[f"{metric}.{stat}"]
            assert a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (metric, stat)
    assert agg["requests"] == own["requests"] == 24 and agg["failed"] == 0
    # Rates: AIPerf divides whole requests by its benchmark duration; slogate counts output shares in
    # its window (first send → last completion). Same run, within 2 %.
    assert agg["request_rate_rps"] == pytest.approx(own["request_rate_rps"], rel=0.02)
    assert agg["output_tokens_per_s"] == pytest.approx(own["output_tokens_per_s"], rel=0.02)


def test_directory_and_files_load_as_aiperf_sides() -> None:
    for path in (AIPERF, AGGREGATE, RECORDS):
        side = load_side(path)
        assert side.kind == "aiperf" and side.records is not None and len(side.records) == 24, path
        assert side.notes and side.results.environment.models == ["llama-3-8b"]
    assert any("inter_token_latency" in n and "TPOT" in n for n in load_side(AGGREGATE).notes)


def test_broken_aiperf_records_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "profile_export_aiperf.json").write_bytes(AGGREGATE.read_bytes())
    (tmp_path / "profile_export.jsonl").write_text('{"metadata": {"request_start_ns": 1}}\nnot json\n')
    with pytest.raises(CompareError, match=r"profile_export\.jsonl:2: not JSON"):
        load_side(tmp_path)


def test_compare_shows_aiperf_beside_a_slogate_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = replay(make_trace(tmp_path / "t.jsonl.zst", rate=10.0, seconds=2.0), tmp_path / "run")
    assert slogate(["compare", str(run), str(AIPERF), str(RECORDS), "--fail-if", "ttft_s.p99<0"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:1].isalpha()}
    for metric in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "itl_s.p50", "e2e_s.p99"):
        values = rows[metric]
        assert values[0] != "–" and values[1] != "–" and values[4] != "–", (metric, values)
    assert "aiperf: tpot_s = AIPerf inter_token_latency" in out
    assert f"{RECORDS} (AIPerf export)" in out


def test_aiperf_errors_count_as_failed(tmp_path: Path) -> None:
    """AIPerf's error shapes (ErrorDetails on a record, ErrorDetailsCount in error_summary) on the real
    files: a failed request is a failed record with its status, never its message."""
    rows = [orjson.loads(line) for line in RECORDS.read_bytes().splitlines()]
    rows[3]["error"] = {"code": 503, "type": "Service Unavailable", "message": "SECRET-MESSAGE"}
    rows[3]["metrics"] = {}
    (tmp_path / "profile_export.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    obj = orjson.loads(AGGREGATE.read_bytes())
    obj["error_summary"] = [{"error_details": rows[3]["error"], "count": 1}]
    obj["completed_request_count"]["avg"] = 23
    (tmp_path / "profile_export_aiperf.json").write_bytes(orjson.dumps(obj))
    failed = [r for r in ap.read_records(tmp_path / "profile_export.jsonl") if r.error is not None]
    assert [(r.status, r.error) for r in failed] == [(503, "upstream_status")]
    agg = ap.aggregate_summary(obj)
    assert (agg.requests, agg.failed, agg.failed_by_class) == (24, 1, {"upstream_status": 1})
    assert agg.slo_attainment == pytest.approx(23 / 24)
    own = load_side(tmp_path / "profile_export.jsonl").results.summary
    assert own.failed == 1 and own.failed_by_class == {"upstream_status": 1}
    assert "SECRET-MESSAGE" not in repr(failed)
