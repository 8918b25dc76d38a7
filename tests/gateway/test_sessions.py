"""Session derivation at capture (gateway/sessions.py) through the real Capture and writer thread:
prefix continuation, `--session-header`, the `user` field, forks, the window, and no raw key or
prompt text in the written segments."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate.gateway.capture import Capture, perf_epoch
from slogate.gateway.config import build_config
from slogate.gateway.sessions import parse_sources
from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from slogate.traces.usage import UsageError

SYSTEM = "You are a careful assistant. " * 20  # shared by every conversation (several 256-byte blocks)


def _capture(tmp_path: Path, **trace) -> Capture:
    cfg = build_config({"upstreams": ["http://127.0.0.1:1"], "trace": {"dir": str(tmp_path / "t"), **trace}})
    start_ns, start_unix = perf_epoch()
    return Capture(cfg, start_ns=start_ns, start_unix=start_unix, config_digest="b2:test")


def _chat(*turns: str, user: str | None = None) -> dict:
    """A conversation: system prompt, then alternating user/assistant messages."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    body: dict = {"model": "m", "messages": messages}
    if user is not None:
        body["user"] = user
    return body


def _written(cap: Capture, items: list[tuple[RequestRecord, dict, str | None]]) -> list[RequestRecord]:
    cap.start()
    for record, body, header in items:
        cap.submit(record, body, header)
    cap.close()
    records = read_trace(cap.writer.config.directory).records
    assert len(records) == len(items)
    return records


def _rec(t: float, e2e: float) -> RequestRecord:
    return RequestRecord(t=t, e2e=e2e, ttft=0.01, output_tokens=8)


def test_prefix_continuation_gives_turns_think_and_a_fork(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    q1, a1, q2, a2, q3 = "How do I sort a list?", "Use sorted().", "And in reverse?", "reverse=True.", "Thanks!"
    items = [
        (_rec(0.0, 1.0), _chat(q1), None),  # A0
        (_rec(0.5, 1.0), _chat("Something else entirely"), None),  # B0: same system prompt, other question
        (_rec(1.25, 1.0), _chat(q1, a1, q2), None),  # A1: 0.25 s after A0 ended
        (_rec(3.0, 0.5), _chat(q1, a1, q2, a2, q3), None),  # A2: 0.75 s after A1 ended
        (_rec(4.0, 0.5), _chat(q1, a1, "A different follow-up"), None),  # branches from A0 after A1, A2: a child
        (_rec(5.0, 0.5), _chat(q1), None),  # A0's prompt again: not longer, so a new session
    ]
    a0, b0, a1r, a2r, fork, again = _written(_capture(tmp_path), items)
    assert a0.session and a0.session == a1r.session == a2r.session
    assert [a0.turn, a1r.turn, a2r.turn] == [0, 1, 2]
    assert a0.think is None and a1r.think == pytest.approx(0.25) and a2r.think == pytest.approx(0.75)
    assert b0.session not in (None, a0.session) and b0.turn == 0
    assert fork.session not in (a0.session, b0.session) and fork.turn == 0 and fork.parent_session == a0.session
    assert fork.think == pytest.approx(3.0)  # from A0's end
    assert again.session not in (a0.session, b0.session, fork.session) and again.turn == 0


def test_a_retry_of_a_failed_turn_continues_the_session(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    failed = RequestRecord(t=1.5, e2e=0.5, status=503, error="upstream_status")
    a0, bad, retry = _written(_capture(tmp_path), [(_rec(0.0, 1.0), _chat("q"), None),
                                                  (failed, _chat("q", "a", "q2"), None),
                                                  (_rec(2.25, 1.0), _chat("q", "a", "q2"), None)])
    assert a0.session == bad.session == retry.session and [a0.turn, bad.turn, retry.turn] == [0, 1, 2]
    assert retry.think == pytest.approx(0.25) and retry.parent_session is None


def test_a_turn_sent_before_the_answer_ended_is_not_a_continuation(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    a0, early = _written(_capture(tmp_path), [(_rec(0.0, 2.0), _chat("q"), None),
                                              (_rec(1.0, 2.0), _chat("q", "a", "q2"), None)])
    assert early.session != a0.session and early.turn == 0


def test_prefix_continuation_ends_after_the_window(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    a0, late = _written(_capture(tmp_path, session_window=5.0),
                        [(_rec(0.0, 1.0), _chat("q"), None), (_rec(10.0, 1.0), _chat("q", "a", "q2"), None)])
    assert late.session != a0.session and late.turn == 0


def test_session_header_wins_over_user_and_is_never_stored(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    cap = _capture(tmp_path, session_header="X-Session-Id")
    secret_header, secret_user = "sess-canary-1234", "user-canary-5678"
    items = [
        (_rec(0.0, 1.0), _chat("one", user=secret_user), secret_header),
        (_rec(1.5, 1.0), _chat("unrelated prompt", user=secret_user), secret_header),  # same header: same session
        (_rec(2.0, 1.0), _chat("two", user=secret_user), None),  # no header: the user field
        (_rec(3.5, 1.0), _chat("three", user=secret_user), None),
        (_rec(4.0, 1.0), _chat("four", user="someone else"), None),
    ]
    h0, h1, u0, u1, other = _written(cap, items)
    assert h0.session == h1.session and [h0.turn, h1.turn] == [0, 1] and h1.think == pytest.approx(0.5)
    assert u0.session == u1.session != h0.session and [u0.turn, u1.turn] == [0, 1] and u1.think == pytest.approx(0.5)
    assert other.session not in (h0.session, u0.session)
    raw = b"".join(p.read_bytes() for p in cap.writer.paths)
    import zstandard

    text = b"".join(zstandard.ZstdDecompressor().stream_reader(p.open("rb")).read() for p in cap.writer.paths)
    for secret in (secret_header, secret_user, "unrelated prompt", SYSTEM[:40]):
        assert secret.encode() not in raw and secret.encode() not in text


def test_sessions_off_and_the_header_ignored_without_its_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    off = _written(_capture(tmp_path / "off", session_from="off"),
                   [(_rec(0.0, 1.0), _chat("q"), None), (_rec(2.0, 1.0), _chat("q", "a", "q2"), None)])
    assert all(r.session is None and r.turn is None for r in off)
    cap = _capture(tmp_path / "p", session_from="prefix", session_header="X-S")
    assert cap.session_header is None  # header not among the sources: hand_off reads no header
    only = _written(cap, [(_rec(0.0, 1.0), _chat("q"), "k"), (_rec(2.0, 1.0), _chat("q", "a", "q2"), "k")])
    assert only[0].session == only[1].session and only[1].turn == 1


def test_bad_session_settings_name_the_key() -> None:
    with pytest.raises(UsageError, match=r"trace.session_from \(--session-from\).*got \"header,cookie\""):
        build_config({"upstreams": ["http://127.0.0.1:1"], "trace": {"session_from": "header,cookie"}})
    with pytest.raises(UsageError, match=r"--session-header"):
        build_config({"upstreams": ["http://127.0.0.1:1"], "trace": {"session_header": "X Bad"}})
    with pytest.raises(UsageError, match=r"--session-window"):
        build_config({"upstreams": ["http://127.0.0.1:1"], "trace": {"session_window": 0}})
    assert parse_sources("prefix,header") == ("prefix", "header")


def _conversations(n: int, turns: int, *, keyed: bool) -> list[tuple[RequestRecord, dict, str | None]]:
    """`n` interleaved conversations of `turns` turns (each turn the whole conversation so far), keyed
    by `--session-header` or found by prefix continuation only; 0.1 s of think time between turns."""
    items = []
    for k in range(turns):
        for i in range(n):
            said = [f"conversation {i} turn {j}" if j % 2 == 0 else "ok" for j in range(2 * k + 1)]
            items.append((_rec(k * 2.0 + i * 0.01, 1.0), _chat(*said), f"conv-{i}" if keyed else None))
    return items


def _captured(cap: Capture, items: list[tuple[RequestRecord, dict, str | None]]) -> dict[str, list[RequestRecord]]:
    cap.start()
    for record, body, header in items:
        cap.submit(record, body, header)
    cap.close()
    by: dict[str, list[RequestRecord]] = {}
    for r in read_trace(cap.writer.config.directory).records:
        by.setdefault(r.session, []).append(r)
    return by


@pytest.mark.parametrize("keyed", [True, False], ids=["header", "prefix"])
def test_trace_sample_keeps_or_drops_whole_sessions(tmp_path, monkeypatch, keyed) -> None:
    """--trace-sample 0.5 over 60 conversations of 4 turns: about half the sessions are captured, each
    with all its turns (a keyed session by a salted digest of its key, a prefix session once the writer
    knows it); the same seed captures the same sessions, another seed others."""
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    items = _conversations(60, 4, keyed=keyed)
    header = {"session_header": "X-Session-Id"} if keyed else {}
    by = _captured(_capture(tmp_path / "a", sample=0.5, seed=1, **header), items)
    assert 18 <= len(by) <= 42, len(by)  # binomial(60, 0.5): ±3.9 sd
    for turns in by.values():
        assert [r.turn for r in turns] == [0, 1, 2, 3] and all(r.parent_session is None for r in turns)
        assert [round(r.think, 6) for r in turns[1:]] == [1.0, 1.0, 1.0]
    cap = _capture(tmp_path / "b", sample=0.5, seed=1, **header)
    again = _captured(cap, _conversations(60, 4, keyed=keyed))
    assert cap.sampled_out == 4 * (60 - len(by))
    firsts = lambda b: sorted(round(t[0].t, 3) for t in b.values())  # noqa: E731 (which conversations)
    assert firsts(again) == firsts(by)
    other = _captured(_capture(tmp_path / "c", sample=0.5, seed=2, **header), _conversations(60, 4, keyed=keyed))
    assert firsts(other) != firsts(by)


@pytest.mark.parametrize("keyed", [True, False], ids=["header", "prefix"])
def test_trace_sample_without_a_seed_keeps_whole_sessions_and_loses_none(tmp_path, monkeypatch, keyed) -> None:
    """--trace-sample 0.5 without --trace-seed (the default): a keyed session's digest once formatted the
    missing seed and raised, losing those records. Now the seed is 0 (the salt keeps the choice unguessable):
    whole sessions, about half, the same ones in a second capture with the same salt."""
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    header = {"session_header": "X-Session-Id"} if keyed else {}
    cap = _capture(tmp_path / "a", sample=0.5, **header)
    by = _captured(cap, _conversations(60, 4, keyed=keyed))
    assert 18 <= len(by) <= 42, len(by)
    assert all([r.turn for r in turns] == [0, 1, 2, 3] for turns in by.values())
    assert cap.sampled_out == 4 * (60 - len(by))  # every request is either written or sampled out
    again = _captured(_capture(tmp_path / "b", sample=0.5, **header), _conversations(60, 4, keyed=keyed))
    firsts = lambda b: sorted(round(t[0].t, 3) for t in b.values())  # noqa: E731
    assert firsts(again) == firsts(by)


def test_trace_sample_without_sessions_samples_requests(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLOGATE_TRACE_SALT", "s")
    by = _captured(_capture(tmp_path, sample=0.5, seed=1, session_from="off"), _conversations(60, 4, keyed=False))
    kept = sum(len(t) for t in by.values())
    assert set(by) == {None} and 90 <= kept <= 150, kept  # binomial(240, 0.5): ±3.9 sd
