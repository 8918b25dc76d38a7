"""`--virtual` runs write the simulated engine's telemetry (running batch, waiting queue, KV-cache usage,
preemptions, prefix counters) every virtual second into metrics.jsonl, the structure `--scrape-metrics`
fills over HTTP, marked `"source": "sim-virtual"`; the report's "what binds" reads it and says so.
Real virtual replays on the sim: a run under capacity (running equals the requests in flight by the
records), one held by max_num_seqs, one by a tiny KV cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate.cli import main as slogate
from slogate.replay.virtual_samples import SOURCE, VirtualSamples
from slogate.traces.reader import read_trace
from tests.replay.test_compare_runs import capacity_rps, make_trace, replay

TARGET = "sim:h100-sxm/llama-3-8b?jitter=0&max_num_seqs={seats}"


def samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def binding(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert slogate(["report", str(run), "-o", str(tmp_path / "r.html"), "--no-plots"]) == 0
    capsys.readouterr()
    concl = json.loads((tmp_path / "conclusions.json").read_text())["conclusions"]
    found, = [c for c in concl if c["topic"] == "binding"]
    return found


def test_virtual_run_records_the_engines_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rate = round(0.5 * capacity_rps())
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=rate, seconds=4)
    run = replay(trace, tmp_path / "under", target=TARGET.format(seats=4))
    got = samples(run)
    assert [s["t"] for s in got] == [float(k) for k in range(len(got))] and len(got) >= 4
    assert all(s["source"] == SOURCE for s in got)
    assert all(set(s["metrics"]) == {"running", "waiting", "kv_cache_usage", "preemptions_total",
                                     "prefix_cache_queries_total", "prefix_cache_hits_total"} for s in got)
    # under capacity nothing waits, so the running batch is the requests in flight by the records
    records = read_trace(run / "requests.jsonl.zst").records
    for s in got[1:-1]:
        t = s["t"]
        in_flight = sum(1 for r in records if r.t < t < r.t + (r.e2e or 0))
        assert abs(s["metrics"]["running"] - in_flight) <= 1, (t, s, in_flight)
        assert s["metrics"]["waiting"] == 0 and 0 < s["metrics"]["kv_cache_usage"] < 0.5
    found = binding(run, tmp_path, capsys)
    assert found["values"]["limit"] == "decode_bandwidth" and found["values"]["telemetry_source"] == "sim-virtual"
    assert "server telemetry from the simulated engine, sampled in virtual time" in found["text"]


def test_binding_limit_from_virtual_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Past capacity with 4 seats the queue grows behind a full batch; with 64 seats and 20 KV blocks
    (four requests' worth) the cache fills first."""
    trace = make_trace(tmp_path / "t.jsonl.zst", rate=round(2 * capacity_rps()), seconds=3)
    seats = binding(replay(trace, tmp_path / "seats", target=TARGET.format(seats=4)), tmp_path, capsys)
    assert seats["values"]["limit"] == "scheduler:max_num_seqs", seats["text"]
    assert seats["values"]["running"] == 4 and seats["values"]["waiting"] > 4
    kv = binding(replay(trace, tmp_path / "kv", target=TARGET.format(seats=64) + "&kv_blocks=20"), tmp_path, capsys)
    assert kv["values"]["limit"] == "kv_capacity", kv["text"]
    assert kv["values"]["kv_cache_usage"] >= 0.9 and "KV capacity" in kv["text"]


def test_sampler_keeps_an_idle_gaps_state_and_combines_engines() -> None:
    class Kv:
        def __init__(self, used: float) -> None:
            self.used, self.queries, self.hits = used, 10, 5

        def usage(self) -> float:
            return self.used

    class Engine:
        def __init__(self, replica: int, running: int, used: float) -> None:
            self.replica, self.num_running, self.num_waiting = replica, running, 0
            self.kv = Kv(used)
            self.sched = type("S", (), {"num_preemptions": 1})()

    s = VirtualSamples(1.0)
    a = Engine(0, 3, 0.2)
    s(a, 0.5)  # bin 0 (t = 0): the state before this step (idle)
    a.num_running = 0
    s(a, 1.2)  # bin 1: the state after the step at 0.5 (3 running)
    s(a, 4.0)  # bins 2, 3: still 0 running from the step at 1.2; bin 4 exactly now
    b = Engine(1, 2, 0.6)
    s(b, 1.0)
    lines = s.lines()
    assert [ln["t"] for ln in lines] == [0.0, 1.0, 2.0, 3.0, 4.0]
    running = [ln["metrics"]["running"] for ln in lines]
    assert running == [0 + 0, 3 + 2, 0, 0, 0]  # replica 1 ended after bin 1: nothing running there
    assert lines[2]["metrics"]["kv_cache_usage"] == pytest.approx(0.4)  # the mean of both engines' usage
    with pytest.raises(ValueError, match="bad sampling interval 0"):
        VirtualSamples(0)
