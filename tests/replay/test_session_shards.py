"""`slogate merge` of a session replay split by `--shard`: the merged `sessions` block is recomputed
from every shard's records and equals the single run's (virtual time, so exactly)."""

from __future__ import annotations

from slogate.replay.cli.merge import main as merge_main
from slogate.replay.cli.replay import main as replay_main
from slogate.replay.results import load
from tests.replay.test_sessions import write_sessions

TARGET = "sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=20&itl_ms=5"


def test_merged_shards_have_the_single_runs_sessions_block(tmp_path) -> None:
    paths = [str(p) for p in write_sessions(tmp_path)]
    common = [*paths, "--target", TARGET, "--virtual", "--endpoint", "completions", "--quiet"]
    assert replay_main([*common, "--out", str(tmp_path / "single")]) == 0
    for i in range(3):
        assert replay_main([*common, "--shard", f"{i}/3", "--out", str(tmp_path / f"s{i}")]) == 0
    shards = [load(tmp_path / f"s{i}").sessions for i in range(3)]
    assert all(s is not None for s in shards) and sum(s.sessions for s in shards) == 4  # type: ignore[union-attr]
    assert merge_main([str(tmp_path / f"s{i}") for i in range(3)] + ["-o", str(tmp_path / "merged"), "--quiet"]) == 0
    single, merged = load(tmp_path / "single").sessions, load(tmp_path / "merged").sessions
    assert single is not None and merged is not None
    assert (merged.sessions, merged.subagents, merged.turns) == (4, 1, 10)
    assert merged.think_time_s == single.think_time_s
    assert merged.model_time_s == single.model_time_s
    assert merged.duration_s == single.duration_s and merged.ttft_by_turn == single.ttft_by_turn
