"""Session replay at its edges, through the real `slogate replay` / `slogate merge` CLI against the
simulator in virtual time: bad --session-start values are one-line errors, --sample keeps or drops
whole sessions, and a merge of session shards keeps their prefix-cache hit rate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slogate.replay.cli.merge import main as merge_main
from slogate.replay.cli.replay import main as replay_main
from slogate.replay.results import load
from slogate.traces.reader import read_trace
from tests.servers import REPO

AGENTIC = REPO / "traces" / "samples" / "agentic"
TARGET = "sim:h100-sxm/llama-3-8b"
_RUN = "import sys; from slogate.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("start", ["stagger:inf", "stagger:-1", "stagger:nan", "poisson:rate=inf"])
def test_bad_session_start_is_a_one_line_error(tmp_path: Path, start: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _RUN, "replay", str(AGENTIC), "--target", TARGET, "--virtual",
                           "--session-start", start, "--quiet", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if "RuntimeWarning" not in ln and "from slogate" not in ln]
    assert len(lines) == 1 and f"bad --session-start {start!r}" in lines[0] and "stagger:SECONDS" in lines[0]


def test_sample_keeps_or_drops_whole_sessions(tmp_path: Path) -> None:
    """Sampling turn by turn would send a conversation from its middle (its first turns dropped, no prefix
    to reuse): every kept session has all its turns, a subagent goes with its parent."""
    kept_any = dropped_any = False
    for seed in range(4):
        out = tmp_path / f"s{seed}"
        assert replay_main([str(AGENTIC), "--target", TARGET, "--virtual", "--sample", "0.5", "--seed", str(seed),
                            "--quiet", "--out", str(out)]) == 0
        turns: dict[str, list[int]] = {}
        for r in read_trace(out / "requests.jsonl.zst").records:
            turns.setdefault(r.session or "", []).append(r.turn or 0)
        for session, got in turns.items():
            assert sorted(got) == list(range(len(got))), (seed, session, got)  # from turn 0, none missing
        expected = {"session_a": 4, "session_a.1": 2, "session_b": 3, "session_c": 3}
        assert {s: len(t) for s, t in turns.items()} == {s: n for s, n in expected.items() if s in turns}
        assert ("session_a.1" in turns) == ("session_a" in turns)
        kept_any |= bool(turns)
        dropped_any |= len(turns) < len(expected)
    assert kept_any and dropped_any


def test_merged_session_shards_keep_the_prefix_cache_hit_rate(tmp_path: Path) -> None:
    common = [str(AGENTIC), "--target", TARGET, "--virtual", "--quiet"]
    for i in range(2):
        assert replay_main([*common, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    shards = [load(tmp_path / f"s{i}") for i in range(2)]
    rates = [s.prefix_cache_hit_rate for s in shards]
    assert all(r is not None and 0 < r < 1 for r in rates), rates
    assert merge_main([str(tmp_path / "s0"), str(tmp_path / "s1"), "-o", str(tmp_path / "m"), "--quiet"]) == 0
    merged = load(tmp_path / "m")
    weights = [s.summary.input_tokens for s in shards]
    expected = sum(r * w for r, w in zip(rates, weights, strict=True)) / sum(weights)  # type: ignore[operator]
    assert merged.prefix_cache_hit_rate == pytest.approx(expected)
    assert min(rates) <= merged.prefix_cache_hit_rate <= max(rates)  # type: ignore[operator]
