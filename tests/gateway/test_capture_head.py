"""`slogate trace head DIR -n N` of a real capture that rotated into several segments and was
restarted into the same directory: N records, read on from one segment to the next (not only the
first segment's), with `t` on the header's clock as `trace stats` / the reader put them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import read_trace
from slogate.traces.segments import list_segments
from tests.gateway.fixtures_gateway import SIM_MODEL, ChatSender, trace_counts, wait_for
from tests.realservers import start_gateway
from tests.simserver import start_sim

PER_RUN = 3


def _capture_one_by_one(sim_url: str, trace: Path) -> None:
    """PER_RUN requests, each flushed (and, with 1-byte rotation, in a segment of its own) before the next."""
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    with start_gateway(sim_url, trace_dir=trace,
                       extra_args=("--trace-flush-interval", "0.05", "--trace-rotate-bytes", "1")) as gw:
        send = ChatSender(gw.url, chat)
        for i in range(1, PER_RUN + 1):
            send(1)
            assert wait_for(lambda i=i: trace_counts(gw.admin_url) == (i, 0), timeout=10), trace_counts(gw.admin_url)


@pytest.mark.timeout(60)
@pytest.mark.slow  # ~3 s: a sim and two gateway runs
def test_head_of_a_capture_dir_reads_across_segments_and_restarts(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        _capture_one_by_one(sim.url, trace)
        _capture_one_by_one(sim.url, trace)  # a restart into the same directory: a later start_unix
    assert len(list_segments(trace)) == 2 * PER_RUN
    full = read_trace(trace)
    out = subprocess.run([sys.executable, "-m", "slogate", "trace", "head", str(trace), "-n", "100"],
                         capture_output=True, timeout=60, check=True).stdout.splitlines()
    header, records = orjson.loads(out[0]), [orjson.loads(line) for line in out[1:]]
    assert header["kind"] == "header" and header["start_unix"] == full.header.start_unix
    assert len(records) == 2 * PER_RUN, len(records)  # without reading on: the first segment's 1 record
    assert sorted(r["t"] for r in records) == sorted(r.t for r in full.records)
    out = subprocess.run([sys.executable, "-m", "slogate", "trace", "head", str(trace), "-n", "4"],
                         capture_output=True, timeout=60, check=True).stdout.splitlines()
    assert len(out) == 1 + 4
