"""Distributed replay: 3 shard processes started at one wall-clock time, merged, equal a single run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slogate.replay.cli.merge import main as merge_main
from slogate.replay.cli.replay import main as replay_main
from slogate.replay.merge import merge_dirs
from slogate.replay.outputs.records import read
from slogate.replay.results import load
from slogate.traces.metrics import summarize
from slogate.traces.record import is_error
from slogate.traces.usage import UsageError
from tests.replay.conftest import AZURE
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
    with pytest.raises(UsageError, match="not a replay result directory"):
        merge_dirs([tmp_path])


# -- shards of one replay only, each once; virtual time; drift -----------------------------------------

TRACE_ARGS = [str(AZURE), "--max-requests", "100", "--quiet"]
VIRTUAL = ["--target", "sim:h100-sxm/llama-3-8b", "--virtual"]


def _virtual(out, *extra: str) -> str:
    """A virtual replay of the trace's first 100 requests (SLO ttft=0.5 unless `extra` gives one)."""
    slo = [] if "--slo" in extra else ["--slo", "ttft=0.5"]
    assert replay_main([*TRACE_ARGS, *VIRTUAL, *slo, "--out", str(out), *extra]) == 0
    return str(out)


@pytest.fixture(scope="module")
def virtual_shards(tmp_path_factory) -> tuple[str, str, str]:
    """Shards 0/2 and 1/2 of a virtual replay run one after the other (different wall-clock starts),
    and the unsharded run."""
    d = tmp_path_factory.mktemp("virtual")
    shards = [_virtual(d / "s0", "--shard", "0/2")]
    time.sleep(0.1)  # a virtual run takes milliseconds: make the wall-clock starts differ for certain
    shards.append(_virtual(d / "s1", "--shard", "1/2"))
    return shards[0], shards[1], _virtual(d / "single")


@pytest.fixture(scope="module")
def http_shards(tmp_path_factory) -> tuple[str, str]:
    """Shards 0/2 and 1/2 of a real-clock replay without --start-at, output lengths not forced (drift)."""
    d = tmp_path_factory.mktemp("http")
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim:
        for i in range(2):
            assert replay_main([str(AZURE), "--max-requests", "60", "--speed", "30", "--slo", "ttft=0.5", "--quiet",
                                "--target", sim.url, "--force-output", "none", "--shard", f"{i}/2",
                                "--out", str(d / f"s{i}")]) == 0
    return str(d / "s0"), str(d / "s1")


def _copies(tmp_path, *dirs: str) -> list[str]:
    """Copies of shard directories (a test that could write into its inputs never touches the fixture's)."""
    return [str(shutil.copytree(d, tmp_path / f"in{i}")) for i, d in enumerate(dirs)]


@pytest.mark.parametrize(("out", "needle"), [("in0", "is the input"), ("in0/merged", "is inside the input")])
def test_merge_refuses_an_output_that_is_an_input(tmp_path, virtual_shards, out: str, needle: str) -> None:
    s0, s1 = _copies(tmp_path, *virtual_shards[:2])
    before = {p.name: p.read_bytes() for p in Path(s0).iterdir()}
    with pytest.raises(UsageError, match=needle):
        merge_main([s0, s1, "-o", str(tmp_path / out), "--quiet"])
    assert {p.name: p.read_bytes() for p in Path(s0).iterdir()} == before


@pytest.mark.parametrize("out", ["one.csv", "one.csv/merged"])
def test_merge_refuses_an_existing_file_as_output(tmp_path, virtual_shards, out: str) -> None:
    (tmp_path / "one.csv").write_text("x\n")
    with pytest.raises(UsageError, match=r"one\.csv (exists and )?is (not a directory|a file)"):
        merge_main([*virtual_shards[:2], "-o", str(tmp_path / out), "--quiet"])


def test_merge_refuses_a_shard_given_twice(tmp_path, virtual_shards) -> None:
    s0, s1, _ = virtual_shards
    with pytest.raises(UsageError, match="is given twice"):
        merge_dirs([s0, s1, f"{s1}/."])
    copy = shutil.copytree(s1, tmp_path / "copy")  # the same run by content
    with pytest.raises(UsageError, match="both hold shard 1/2"):
        merge_dirs([s0, s1, copy])


@pytest.mark.parametrize(("extra", "needle"), [
    (["--shard", "1/2", "--slo", "ttft=1"], "different SLOs: {'default': 'ttft=0.5'} vs {'default': 'ttft=1'}"),
    (["--shard", "1/2", "--speed", "2"], "different workload"),
    (["--shard", "1/2", "--target", "sim:a100-80g/llama-3-8b"], "different target"),
    (["--shard", "1/3"], "split the replay differently"),
    ([], "is not a shard"),
])
def test_merge_refuses_runs_of_other_replays(tmp_path, virtual_shards, extra: list[str], needle: str) -> None:
    other = _virtual(tmp_path / "other", *extra)
    with pytest.raises(UsageError, match=re.escape(needle)):
        merge_dirs([virtual_shards[0], other])


def test_merge_refuses_real_clock_with_virtual_time(virtual_shards, http_shards) -> None:
    with pytest.raises(UsageError, match="different clock: 'real' vs 'virtual'"):
        merge_dirs([http_shards[0], virtual_shards[1]])


def test_virtual_shards_merge_to_the_single_runs_timeline(virtual_shards) -> None:
    s0, s1, single = virtual_shards
    assert load(s1).environment.start_unix - load(s0).environment.start_unix > 0.01
    merged = merge_dirs([s0, s1])
    one = load(single).summary
    _, srecs = read(single)
    assert [r.t for r in merged.records] == pytest.approx([r.t for r in srecs], abs=1e-9)
    assert merged.results.summary.duration_s == pytest.approx(one.duration_s, rel=1e-9)
    assert merged.results.summary.offered_rate_rps == pytest.approx(one.offered_rate_rps, rel=1e-9)


def test_merged_drift_is_recomputed_from_the_merged_records(http_shards) -> None:
    shards = [load(d) for d in http_shards]
    merged = merge_dirs(list(http_shards))
    ok = [r for r in merged.records if not is_error(r) and r.max_tokens is not None and r.output_tokens is not None]
    expected = sum(abs(r.output_tokens - r.max_tokens) for r in ok) / sum(r.max_tokens for r in ok)  # README's drift
    drifts = [s.summary.output_token_drift for s in shards]
    assert all(d is not None for d in drifts) and expected != pytest.approx(max(drifts))  # type: ignore[type-var]
    s = merged.results.summary
    assert s.output_token_drift == pytest.approx(expected, rel=1e-12)
    assert s.output_drift_requests == sum(x.summary.output_drift_requests or 0 for x in shards)
    assert s.output_drift_worst == max(x.summary.output_drift_worst or 0.0 for x in shards)
    # real-clock shards keep their wall-clock alignment (the later shard is shifted by its later start)
    base = min(x.environment.start_unix for x in shards)
    shifted = sorted(r.t + x.environment.start_unix - base for d, x in zip(http_shards, shards, strict=True)
                     for r in read(d)[1])
    assert [r.t for r in merged.records] == pytest.approx(shifted, abs=1e-6)
