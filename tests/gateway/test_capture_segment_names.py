"""Segment names already taken in the trace directory (another gateway writing there, or a restart
within the same second: both name their segments `slogate-<UTC second>-<seq>`): the writer skips to
the next free sequence number instead of losing the frame's records and waiting out a disk-error
retry, and never touches the other process's files."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import read_trace
from slogate.traces.segments import segment_name
from tests.gateway.fixtures_gateway import SIM_MODEL, ChatSender, trace_counts, wait_for
from tests.realservers import start_gateway
from tests.simserver import start_sim

TAKEN_SECONDS = 40  # names taken from now on: longer than the test can run
TAKEN_SEQS = 3


@pytest.mark.timeout(60)
def test_gateway_skips_segment_names_taken_by_another_process(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.mkdir()
    now = int(time.time())
    taken = [trace / segment_name("slogate", seq, now + s) for s in range(-1, TAKEN_SECONDS) for seq in range(TAKEN_SEQS)]
    for path in taken:  # another gateway's segments, just created (empty: it was killed before its header)
        path.touch()
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, start_gateway(
        sim.url, trace_dir=trace, extra_args=("--trace-flush-interval", "0.1"),
    ) as gw:
        send = ChatSender(gw.url, chat)
        send(5)
        assert wait_for(lambda: sum(trace_counts(gw.admin_url)) == send.sent, timeout=10), trace_counts(gw.admin_url)
        counts = trace_counts(gw.admin_url)
        log = gw.log_text()
    assert counts == (5, 0), (counts, log)  # without the skip: (0, 5), "File exists"
    assert "being lost" not in log, log
    assert len(read_trace(trace).records) == 5
    assert all(p.stat().st_size == 0 for p in taken)  # the other process's files are untouched
    ours = sorted(set(trace.iterdir()) - set(taken))
    assert len(ours) == 1 and ours[0].name.endswith(f"-{TAKEN_SEQS:06d}.jsonl.zst"), ours
