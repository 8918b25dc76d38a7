"""Two gateways with different salts capturing into one trace directory: each writes all its records
(segment names never clash), and reading the directory as one trace is refused with one line naming
both salts' segments and the fix (their prefix ids and session hashes never match), instead of being
read silently under the first segment's salt, which also let `trace merge` mix salts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import SegmentReader, read_trace
from slogate.traces.segments import list_segments
from tests.gateway.fixtures_gateway import SIM_MODEL, ChatSender, trace_counts, wait_for
from tests.realservers import start_gateway
from tests.simserver import start_sim


def _trace_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slogate", "trace", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.timeout(60)
def test_two_salts_in_one_trace_dir_are_refused_naming_the_fix(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    args = ("--trace-flush-interval", "0.1")
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            start_gateway(sim.url, trace_dir=trace, extra_args=args, env={"SLOGATE_TRACE_SALT": "salt-a"}) as a, \
            start_gateway(sim.url, trace_dir=trace, extra_args=args, env={"SLOGATE_TRACE_SALT": "salt-b"}) as b:
        for gw in (a, b):
            ChatSender(gw.url, chat)(3)
        for gw in (a, b):
            assert wait_for(lambda gw=gw: trace_counts(gw.admin_url) == (3, 0), timeout=10), trace_counts(gw.admin_url)
    by_salt: dict[str, list[Path]] = {}
    for path in list_segments(trace):
        reader = SegmentReader(path)
        reader.read()
        assert reader.header is not None
        by_salt.setdefault(reader.header.salt_id or "", []).append(path)
    assert len(by_salt) == 2, by_salt
    assert [len(read_trace(paths).records) for paths in by_salt.values()] == [3, 3]  # each capture reads alone

    stats = _trace_cli("stats", str(trace))
    assert stats.returncode == 2, stats.stdout  # without the check: 6 requests, exit 0
    lines = [line for line in stats.stderr.splitlines() if line.startswith("slogate trace: error: ")]
    assert len(lines) == 1, stats.stderr  # one line (a stale-build RuntimeWarning may come before it)
    assert all(salt in lines[0] for salt in by_salt) and "own --trace-dir" in lines[0], lines[0]
    assert _trace_cli("validate", str(trace)).returncode == 1
    merge = _trace_cli("merge", str(trace), "-o", str(tmp_path / "merged.jsonl.zst"))
    assert merge.returncode == 2 and all(salt in merge.stderr for salt in by_salt), merge.stderr
