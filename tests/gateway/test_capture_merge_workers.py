"""`slogate trace merge DIR` of a `--workers 2` capture whose conversations went to both workers (a new
connection per turn): each worker derived prefix sessions from the turns it saw, so a conversation is
split into a session per worker in DIR; merge takes every worker process's segments as a capture of
its own and joins them: one session per conversation, turns 0… in arrival order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import capture_with_two_workers, chat_conversation, http_request

CONVERSATIONS = 4
TURNS = 5  # a conversation stays on one worker with odds 2 / 2**5 each


def _conversation(url: str, c: int) -> None:
    """A new connection per turn: the kernel spreads the turns over both workers."""

    def send(body: bytes) -> dict:
        status, _, answer = http_request(url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        assert status == 200, answer
        return orjson.loads(answer)

    chat_conversation(c, TURNS, send)


@pytest.mark.timeout(60)
@pytest.mark.slow  # ~4 s: a sim, a gateway with two workers, the merge
def test_merge_joins_sessions_split_over_workers(tmp_path: Path) -> None:
    trace, out = tmp_path / "trace", tmp_path / "merged.jsonl.zst"
    capture_with_two_workers(trace, _conversation, CONVERSATIONS, CONVERSATIONS * TURNS)
    merge = subprocess.run([sys.executable, "-m", "slogate", "trace", "merge", str(trace), "-o", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert merge.returncode == 0, merge.stderr
    by_session: dict[str, list] = {}
    for r in read_trace(out).records:
        by_session.setdefault(r.session, []).append(r)
    assert len(by_session) == CONVERSATIONS, {s: len(rs) for s, rs in by_session.items()}  # before: one per worker
    for records in by_session.values():
        assert len({r.hash_ids[0] for r in records}) == 1  # one conversation (its system prompt's block)
        assert [r.turn for r in records] == list(range(TURNS))  # in arrival order
        assert [r.input_tokens for r in records] == sorted(r.input_tokens for r in records)
