"""`slogate trace merge`: captures of two gateways (real Capture + writer thread, one salt) become one
trace whose sessions are whole again — a prefix-continuation conversation that moved between
gateways is joined, a keyed session is renumbered across both, think times are recomputed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slogate.gateway.capture import Capture
from slogate.gateway.config import build_config
from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from slogate.traces.trace_cli import main as trace_main
from slogate.traces.usage import UsageError

SYSTEM = "Shared system prompt of the agent fleet. " * 16


def _chat(*turns: str) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "m", "messages": messages}


def _capture(folder: Path, start_unix: float, items: list[tuple[float, float, dict, str | None]]) -> Path:
    cfg = build_config({"upstreams": ["http://127.0.0.1:1"],
                        "trace": {"dir": str(folder), "session_header": "X-Session-Id"}})
    cap = Capture(cfg, start_ns=0, start_unix=start_unix, config_digest="b2:test")
    cap.start()
    for t, e2e, body, header in items:
        cap.submit(RequestRecord(t=t, e2e=e2e, input_tokens=len(str(body)) // 4, output_tokens=8), body, header)
    cap.close()
    return folder


def _sessions(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    by: dict[str, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: r.t):
        by.setdefault(r.session or "", []).append(r)
    return by


def _long(text: str) -> str:
    return (text + " ") * 30  # several 256-byte blocks per message


def test_merge_joins_a_conversation_across_gateways_and_renumbers_keyed_sessions(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "one salt")
    q1, a1, q2, a2, q3 = map(_long, ("first question", "first answer", "second question", "second answer", "third"))
    # gateway A (t = 0 at 1000.0): turns 0 and 1 of a conversation, and turn 0 of keyed session "k"
    a = _capture(tmp_path / "a", 1000.0, [(0.0, 1.0, _chat(q1), None), (1.5, 1.0, _chat(q1, a1, q2), None),
                                          (0.2, 0.5, _chat("hello"), "k")])
    # gateway B (t = 0 at 1003.0): turn 2 of the conversation (t = 4.0 on A's clock), turn 1 of "k"
    b = _capture(tmp_path / "b", 1003.0, [(1.0, 1.0, _chat(q1, a1, q2, a2, q3), None), (0.0, 0.5, _chat("more"), "k")])
    alone_a, alone_b = _sessions(read_trace(a).records), _sessions(read_trace(b).records)
    assert len(alone_a) == 2 and len(alone_b) == 2  # each gateway alone: the conversation is split
    out = tmp_path / "merged.jsonl.zst"
    assert trace_main(["merge", str(a), str(b), "-o", str(out)]) == 0
    merged = read_trace(out)
    assert merged.header.start_unix == 1000.0 and len(merged.records) == 5
    by = _sessions(merged.records)
    assert len(by) == 2
    conv = next(t for s, t in by.items() if s.startswith("p-"))
    keyed = next(t for s, t in by.items() if not s.startswith("p-"))
    assert [r.t for r in conv] == [0.0, 1.5, 4.0] and [r.turn for r in conv] == [0, 1, 2]
    assert [r.think for r in conv] == [None, pytest.approx(0.5), pytest.approx(1.5)]
    assert [r.t for r in keyed] == [0.2, 3.0] and [r.turn for r in keyed] == [0, 1]
    assert keyed[1].think == pytest.approx(2.3)
    assert all(r.parent_session is None for r in merged.records)


def test_merge_refuses_captures_with_different_salts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "salt one")
    a = _capture(tmp_path / "a", 1000.0, [(0.0, 1.0, _chat("x"), None)])
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "salt two")
    b = _capture(tmp_path / "b", 1000.0, [(0.0, 1.0, _chat("x"), None)])
    with pytest.raises(UsageError, match="different salts"):
        trace_main(["merge", str(a), str(b), "-o", str(tmp_path / "m.jsonl.zst")])
    proc = subprocess.run([sys.executable, "-m", "slogate", "trace", "merge", str(a), str(tmp_path / "missing"),
                           "-o", str(tmp_path / "m.jsonl.zst")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such trace file" in proc.stderr and "Traceback" not in proc.stderr


def test_merge_refuses_a_capture_given_twice(tmp_path, monkeypatch) -> None:
    """Under any spelling of its path: its requests would count twice (400 records from 200)."""
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "salt one")
    a = _capture(tmp_path / "a", 1000.0, [(0.0, 1.0, _chat("x"), None)])
    with pytest.raises(UsageError, match="is given twice"):
        trace_main(["merge", str(a), str(a) + "/", "-o", str(tmp_path / "m.jsonl.zst")])
    assert not (tmp_path / "m.jsonl.zst").exists()
