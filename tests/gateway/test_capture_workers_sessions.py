"""`--workers 2` with prefix-continuation sessions: every worker names its new sessions by the run and
its own count of them, so before the worker's segment prefix was in that name, worker 0's first
conversation and worker 1's first conversation were one session id in the capture (unrelated
conversations merged, turns duplicated). Each conversation here keeps one keep-alive connection,
so it stays on one worker, and the kernel spreads the connections over both workers."""

from __future__ import annotations

import http.client
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import capture_with_two_workers, chat_conversation

CONVERSATIONS = 12  # over 2 workers: all on one worker has odds 2 / 2**12
TURNS = 3


def _conversation(url: str, c: int) -> None:
    """One keep-alive connection for the whole conversation: it stays on one worker."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def send(body: bytes) -> dict:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = orjson.loads(resp.read())
        assert resp.status == 200, answer
        return answer

    try:
        chat_conversation(c, TURNS, send)
    finally:
        conn.close()


@pytest.mark.timeout(60)
@pytest.mark.slow  # ~4 s: a sim and a gateway with two workers
def test_workers_never_share_a_prefix_session_id(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    capture_with_two_workers(trace, _conversation, CONVERSATIONS, CONVERSATIONS * TURNS)
    records = read_trace(trace).records
    writers = {p.name.split("-")[1] for p in trace.iterdir()}
    assert writers == {"w0g0", "w1g0"}, writers  # both workers captured conversations
    by_session: dict[str, list] = {}
    for r in records:
        assert r.session is not None and r.hash_ids
        by_session.setdefault(r.session, []).append(r)
    conversations = {s: {r.hash_ids[0] for r in rs} for s, rs in by_session.items()}  # the system prompt's block
    assert all(len(c) == 1 for c in conversations.values()), conversations  # no session mixes conversations
    assert len(by_session) == CONVERSATIONS, len(by_session)
    assert all(sorted(r.turn for r in rs) == list(range(TURNS)) for rs in by_session.values())
