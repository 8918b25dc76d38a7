"""The header line of a real gateway capture: `schema_version`, `block_size` and `block_unit` are
written even at their defaults (a reader must not take them from its own defaults: a newer slogate's
file would otherwise read as v1 here), `start_unix` is the gateway's start on the wall clock, the
segment number is the one in the file name, and the salt is named only by its id."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import zstandard

from slogate import __version__
from slogate.traces.reader import read_trace
from slogate.traces.segments import list_segments
from tests.gateway.fixtures_gateway import SIM_MODEL, ChatSender, trace_counts, wait_for
from tests.realservers import start_gateway
from tests.simserver import start_sim

SALT = "header-test-salt"


def _header_line(path: Path) -> dict:
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as z:
        return orjson.loads(z.read(4096).split(b"\n", 1)[0])


@pytest.mark.timeout(60)
def test_capture_header_states_its_version_and_blocks(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    before = time.time()
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, start_gateway(
        sim.url, trace_dir=trace, env={"SLOGATE_TRACE_SALT": SALT},
        extra_args=("--trace-flush-interval", "0.05", "--trace-rotate-bytes", "1"),
    ) as gw:
        send = ChatSender(gw.url, chat)
        for i in (1, 2):
            send(1)
            assert wait_for(lambda i=i: trace_counts(gw.admin_url) == (i, 0), timeout=10), trace_counts(gw.admin_url)
    segments = list_segments(trace)
    assert len(segments) == 2
    for seq, path in enumerate(segments):
        raw = _header_line(path)
        assert list(raw)[:4] == ["kind", "schema_version", "block_size", "block_unit"], raw  # before: omitted
        assert (raw["schema_version"], raw["block_size"], raw["block_unit"]) == (1, 256, "bytes")
        assert raw.get("segment", 0) == seq and path.name.endswith(f"-{seq:06d}.jsonl.zst")
        assert raw["slogate_version"] == __version__ and raw["source"] == "gateway"
        assert before - 1 < raw["start_unix"] < time.time() and raw["salt_id"].startswith("b2:")
        with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as z:
            assert SALT.encode() not in z.read()  # the salt itself is never written
    assert len({_header_line(p)["start_unix"] for p in segments}) == 1  # one clock base for the capture
    assert len(read_trace(trace).records) == 2
