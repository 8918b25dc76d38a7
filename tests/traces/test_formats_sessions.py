"""Session imports: the agentic JSON format (subagents, local/global ids) and AIPerf's multi-turn
Mooncake (`session_id`, `delay`, `--block-size`, `.jsonl.gz`), and the session figures of trace stats."""

from __future__ import annotations

import gzip
import json

import pytest

from slogate.replay.source import load_trace, trace_workload
from slogate.traces import formats
from slogate.traces.stats import ideal_prefix_reuse, trace_stats
from slogate.traces.usage import UsageError


def _file(path, scope: str, reqs: list[dict], block: int = 64) -> str:
    path.write_text(json.dumps({"block_size": block, "hash_id_scope": scope, "requests": reqs}))
    return str(path)


def _req(t: float, ids: list[int], *, think: float | None = None, api: float = 1.0) -> dict:
    d = {"t": t, "type": "n", "model": "m", "in": 64 * len(ids), "out": 10, "hash_ids": ids, "api_time": api}
    if think is not None:
        d["think_time"] = think
    return d


def test_agentic_sessions_subagents_and_scopes(tmp_path) -> None:
    a = _file(tmp_path / "a.json", "local", [
        _req(0.0, [1, 2]), {"t": 1.5, "type": "subagent", "requests": [_req(1.5, [9]), _req(3.0, [9, 10])]},
        _req(4.0, [1, 2, 3]),  # no think_time: 4.0 − (0 + 1.0) = 3.0
    ])
    b = _file(tmp_path / "b.json", "local", [_req(0.0, [1, 2])])
    assert formats.guess_format(a) == "agentic" and formats.guess_format(tmp_path) == "agentic"
    header, recs = formats.load([a, b], "agentic")
    assert header.block_size == 64 and header.block_unit == "tokens" and header.source == "import:agentic"
    by = {(r.session, r.turn): r for r in recs}
    assert set(by) == {("a", 0), ("a", 1), ("a.1", 0), ("a.1", 1), ("b", 0)}
    assert by["a", 1].think == 3.0 and by["a.1", 1].think == 0.5 and by["a", 0].e2e == 1.0
    assert by["a.1", 0].parent_session == "a" and by["a", 0].parent_session is None
    # local scope: id 1 of a and of b are different blocks; within a file they are the same
    assert by["a", 0].hash_ids != by["b", 0].hash_ids
    assert by["a", 1].hash_ids[:2] == by["a", 0].hash_ids
    g1 = _file(tmp_path / "g1.json", "global", [_req(0.0, [1, 2])])
    g2 = _file(tmp_path / "g2.json", "global", [_req(0.0, [1, 2])])
    _, grecs = formats.load([g1, g2], "agentic")
    assert grecs[0].hash_ids == grecs[1].hash_ids == [1, 2]
    with pytest.raises(UsageError, match="hash_id_scope"):
        load_trace(_file(tmp_path / "bad.json", "shared", [_req(0.0, [1])]))


def test_mooncake_sessions_block_size_and_gzip(tmp_path) -> None:
    rows = [
        {"session_id": "s1", "timestamp": 0, "input_length": 128, "output_length": 5, "hash_ids": [1, 2]},
        {"session_id": "s2", "timestamp": 500, "input_length": 64, "output_length": 5, "hash_ids": [7]},
        {"session_id": "s1", "delay": 2000, "input_length": 192, "output_length": 5, "hash_ids": [1, 2, 3]},
    ]
    p = tmp_path / "t.jsonl.gz"
    p.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    assert formats.guess_format(p) == "mooncake"
    trace = load_trace(p, block_size=64)
    assert trace.header.block_size == 64
    s1 = [r for r in trace.records if r.session == "s1"]
    assert [(r.turn, r.think) for r in s1] == [(0, None), (1, 2.0)] and s1[1].t == 2.0
    w = trace_workload(trace)
    assert w.block_size == 64 and {r.session for r in w.requests} == {"s1", "s2"}
    with pytest.raises(UsageError, match="--block-size"):
        load_trace(p, block_size=0)


def test_stats_sessions_and_ideal_reuse(tmp_path) -> None:
    a = _file(tmp_path / "a.json", "local", [_req(0.0, [1, 2]), _req(2.0, [1, 2, 3, 4], think=1.0)])
    b = _file(tmp_path / "b.json", "local", [_req(0.0, [5]), _req(1.5, [5, 6], think=0.5), _req(3.0, [5, 6, 7])])
    _, recs = formats.load([a, b], "agentic")
    s = trace_stats(recs)
    assert s.sessions is not None and (s.sessions.sessions, s.sessions.subagents) == (2, 0)
    assert s.sessions.turns_per_session.mean == 2.5
    assert s.sessions.think_s.p50 == 0.5 and s.sessions.context_growth_tokens.mean == pytest.approx(
        (128 + 64 + 64) / 3)
    # 2 of 4 blocks of a's turn 1, 1 of 2 of b's turn 1, 2 of 3 of b's turn 2 continue an earlier prompt
    total = 64 * (2 + 4 + 1 + 2 + 3)
    assert s.ideal_prefix_reuse == pytest.approx(64 * (2 + 1 + 2) / total)
    assert ideal_prefix_reuse([]) is None


def test_trace_stats_reads_several_session_files_as_one_trace(capsys) -> None:
    from pathlib import Path

    import slogate.traces.samples
    from slogate.traces.trace_cli import main

    folder = Path(slogate.traces.samples.__file__).parent / "agentic"  # installed as package data
    files = sorted(str(p) for p in folder.glob("*.json"))
    assert main(["stats", *files, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 12 and out["sessions"]["sessions"] == 4 and out["sessions"]["subagents"] == 1
    assert 0.6 < out["ideal_prefix_reuse"] < 0.7
