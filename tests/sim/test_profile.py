"""`--timing profile FILE`: a measured step table, interpolated, drives the engine."""

from __future__ import annotations

import pytest

from slogate.replay.sim.catalog import find_model
from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
from slogate.replay.sim.options import configure
from slogate.replay.sim.profile import load_profile
from slogate.traces.usage import UsageError

# a small measured table (ms): decode rows at 3 batch sizes, prefill rows at 3 chunk sizes;
# not linear (decode flattens at batch 32, prefill grows faster past 1024 tokens)
TABLE = """new_tokens,seqs,kv_tokens,step_ms
1,1,512,12.0
8,8,4096,13.5
32,32,16384,18.0
256,1,256,30.0
1024,1,1024,80.0
2048,1,2048,190.0
"""


@pytest.fixture
def table(tmp_path):
    f = tmp_path / "steps.csv"
    f.write_text(TABLE)
    return str(f)


def test_measured_rows_come_back_and_between_rows_is_between(table):
    p = load_profile(table, find_model("llama-3-8b"))
    for line in TABLE.splitlines()[1:]:
        n, b, k, ms = line.split(",")
        assert p.step_ms(int(n), int(b), int(k)) == pytest.approx(float(ms), abs=1e-6)
    mid = p.step_ms(16, 16, 8192)
    assert 13.5 < mid < 18.0
    assert 80.0 < p.step_ms(1536, 1, 1536) < 190.0
    assert p.step_ms(4096, 1, 4096) > 190.0  # linear extrapolation past the table


def test_profile_drives_engine_and_cli(table):
    config, _, _ = configure(["--timing", "profile", table])
    assert config.timing == "profile" and config.profile == table
    r = simulate([SimRequest(arrival=0.0, prompt_tokens=1024, output_tokens=5)],
                 SimConfig(timing="profile", profile=table, jitter=0.0))[0]
    assert r.ttft == pytest.approx(0.080, rel=0.02)  # the 1024-token prefill row
    assert 0.012 <= r.tpot < 0.0135  # one decoding sequence, ~1 k context: between the decode rows


def test_bad_profile_names_file_and_fix(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("tokens,ms\n1,2\n")
    with pytest.raises(UsageError, match=r"--timing profile .*bad\.csv: expected a CSV header"):
        configure(["--timing", "profile", str(f)])
    with pytest.raises(UsageError, match="profile FILE"):
        configure(["--timing", "profile"])
    with pytest.raises(UsageError, match="needs a table"):
        simulate([SimRequest(arrival=0.0, prompt_tokens=8, output_tokens=2)], SimConfig(timing="profile"))
