"""`slogate sim calibrate` against real servers: a sim with hidden linear constants, and llama.cpp."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from slogate.replay.sim.calibrate import calibrate, to_toml
from slogate.replay.sim.options import configure
from tests.simserver import start_sim

HIDDEN = (8.0, 0.05, 0.5, 0.002)  # A, B, C, D in ms


def test_calibrate_recovers_hidden_linear_constants(tmp_path):
    """The target is a real `slogate sim` over HTTP with 2 % step jitter; within 5 % per constant."""
    with start_sim(timing="linear", seed=3, extra_args=["--linear", ",".join(map(str, HIDDEN))]) as sim:
        cal = asyncio.run(calibrate(sim.url, repeats=5))  # 5: the 2-core test machine is shared
    got = (cal.linear.a_ms, cal.linear.b_ms, cal.linear.c_ms, cal.linear.d_ms)
    for want, have in zip(HIDDEN, got, strict=True):
        assert abs(have - want) / want < 0.05, (HIDDEN, got)
    assert cal.max_num_seqs is None  # the sim batches concurrent requests
    f = tmp_path / "cal.toml"
    f.write_text(to_toml(cal, sim.url))
    config, _, _ = configure(["--config", str(f)])
    assert config.timing == "linear" and config.linear == cal.linear


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.xfail(strict=False, reason="load-sensitive on the shared 2-core machine: with output length forced "
                   "(logit_bias) the calibrated TPOT matched (20.7 vs 20.5 ms), but llama.cpp's own speed changed "
                   "by up to 3x between calibration and workload while other tests ran (TTFT +69 %, then both -31 %)")
def test_calibrated_sim_matches_llama_cpp():
    """Calibrate on llama.cpp (one request at a time, output length forced by logit_bias), then replay
    one workload on both: TTFT and TPOT medians within 10 %.

    The calibration runs before AND after the real workload and the fit uses both (each design
    point's mean), so a change of load on the shared test machine during the run hits both sides.
    """
    from slogate.replay.sim.calibrate import Calibration, Prober, Sample, fit, server_forcing
    from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
    from tests.realservers import start_llama

    sizes = [40, 120, 300, 60, 200, 500, 80, 250]
    design = {"prompt_words": (16, 128, 512), "long_words": 1024, "repeats": 2, "decode_tokens": 24}

    async def workload(url: str) -> list:
        p = Prober(url, None, 120.0, await server_forcing(url))
        try:
            await p.one(8, 4)
            return [await p.one(n, 24) for n in sizes]
        finally:
            p.pool.close()

    with start_llama() as server:
        before = asyncio.run(calibrate(server.url, **design))
        real = asyncio.run(workload(server.url))
        after = asyncio.run(calibrate(server.url, **design))
    assert before.max_num_seqs == after.max_num_seqs == 1
    assert all(r.output_tokens == 24 for r in real), [r.output_tokens for r in real]  # forced (logit_bias)
    samples = [Sample(a.kind, a.new_tokens, a.seqs, a.kv_tokens, (a.step_ms + b.step_ms) / 2)
               for a, b in zip(before.samples, after.samples, strict=True)]
    coef, overhead = fit(samples, batches=False)
    cal = Calibration(linear=coef, ttft_overhead_ms=overhead, max_num_seqs=1, samples=samples)
    reqs = [SimRequest(arrival=100.0 * i, prompt_tokens=n, output_tokens=r.output_tokens or 24)
            for i, (n, r) in enumerate(zip(sizes, real, strict=True))]
    sim = simulate(reqs, SimConfig(timing="linear", linear=cal.linear, jitter=0.0, max_num_seqs=1))
    r_ttft = statistics.median(r.ttft for r in real)
    s_ttft = statistics.median(s.ttft for s in sim) + cal.ttft_overhead_ms / 1e3
    r_tpot = statistics.median(r.tpot for r in real if r.tpot)
    s_tpot = statistics.median(s.tpot for s in sim if s.tpot)
    print("llama.cpp", {"ttft_real": r_ttft, "ttft_sim": s_ttft, "tpot_real": r_tpot, "tpot_sim": s_tpot}, cal)
    assert abs(s_ttft - r_ttft) / r_ttft < 0.10, (r_ttft, s_ttft, cal)
    assert abs(s_tpot - r_tpot) / r_tpot < 0.10, (r_tpot, s_tpot, cal)
