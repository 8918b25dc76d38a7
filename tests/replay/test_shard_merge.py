"""Distributed replay: 3 shard processes started at one wall-clock time, merged, equal a single run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from slogate.replay.cli.merge import main as merge_main
from slogate.replay.merge import merge_dirs
from slogate.replay.outputs.records import read
from slogate.replay.results import load
from slogate.traces.metrics import summarize
from tests.servers import REPO
from tests.simserver import start_sim

# not `-m traces.cli`: run as __main__ its UsageError is another class than the one modules raise
SLOGATE = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())"]

ARGS = ["--synthetic", "poisson:rate=30", "--duration", "4", "--seed", "9", "--input-tokens", "uniform:20,200",
        "--output-tokens", "uniform:2,20", "--endpoint", "completions", "--quiet", "--slo", "ttft=0.2"]


def _cmd(url: str, out, *extra: str) -> list[str]:
    return [*SLOGATE, "replay", *ARGS, "--target", url, "--out", str(out), *extra]


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_three_shards_merge_to_the_single_run(tmp_path) -> None:
    with start_sim(timing="constant", ttft_ms=10, itl_ms=2) as sim:
        single = tmp_path / "single"
        subprocess.run(_cmd(sim.url, single), check=True, cwd=REPO, timeout=120)
        start_at = time.time() + 4.0
        procs = [subprocess.Popen(_cmd(sim.url, tmp_path / f"s{i}", "--shard", f"{i}/3", "--start-at", f"{start_at}"),
                                  cwd=REPO) for i in range(3)]
        assert [p.wait(120) for p in procs] == [0, 0, 0]
    assert merge_main([str(tmp_path / f"s{i}") for i in range(3)] + ["-o", str(tmp_path / "merged"), "--quiet"]) == 0
    merged, one = load(tmp_path / "merged"), load(single)
    _, mrecs = read(tmp_path / "merged")
    _, srecs = read(single)
    # the same requests, at the same intended times, with the same lengths
    assert [(round(r.t, 6), r.input_tokens, r.output_tokens) for r in mrecs] == \
           [(round(r.t, 6), r.input_tokens, r.output_tokens) for r in srecs]
    assert merged.summary.requests == one.summary.requests and merged.summary.failed == 0
    assert merged.environment.shards == ["0/3", "1/3", "2/3"]
    # percentiles recomputed from the merged records, not averaged over shards
    assert merged.summary.ttft_s.p99 == summarize(r.ttft for r in mrecs).p99
    assert merged.summary.offered_rate_rps == pytest.approx(one.summary.offered_rate_rps, rel=1e-9)
    assert merged.summary.ttft_s.p50 == pytest.approx(one.summary.ttft_s.p50, rel=0.25, abs=0.003)
    assert merged.summary.e2e_s.p50 == pytest.approx(one.summary.e2e_s.p50, rel=0.25, abs=0.003)
    assert merged.summary.output_tokens_per_s == pytest.approx(one.summary.output_tokens_per_s, rel=0.1)


def test_merge_refuses_other_directories(tmp_path) -> None:
    from slogate.traces.usage import UsageError

    with pytest.raises(UsageError, match="not a replay result directory"):
        merge_dirs([tmp_path])
