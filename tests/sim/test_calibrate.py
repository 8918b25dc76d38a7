"""`slogate sim calibrate` against real servers: a sim with hidden linear constants, and llama.cpp."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from slogate.replay.sim.calibrate import calibrate, measure, to_toml
from slogate.replay.sim.options import configure
from tests.simserver import start_sim

HIDDEN = (8.0, 0.05, 0.5, 0.002)  # A, B, C, D in ms


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
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
@pytest.mark.timeout(1500)  # 712 s at load average 10-16 on the 2 shared cores
@pytest.mark.xfail(reason="issue 16: TTFT at the 10 % bound on the 2-core CI box (+10.4 % in CI on 2026-12-02, "
                          "+3.2 % on a quiet run); TPOT passes", strict=False)
def test_calibrated_sim_matches_llama_cpp():
    """Calibrate on llama.cpp (one request at a time, output length forced by logit_bias), then replay
    one workload on both: TTFT and TPOT medians within 10 %.

    llama.cpp's speed follows the shared machine's load (it changed up to 3x between a calibration
    and a workload run after it), so the workload is interleaved with the calibration request by
    request: in every round each design request is followed by two workload requests (the 8 sizes
    per round of 4 design sizes), and every point keeps its median over the rounds. A burst of load
    then hits both sides alike.
    """
    from slogate.replay.sim.calibrate import Prober, fit, server_forcing
    from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
    from tests.realservers import start_llama

    sizes = [40, 120, 300, 60, 200, 500, 80, 250]
    sent: list = []  # workload records in send order: round r holds sent[8r : 8r + 8]

    with start_llama() as server:
        p = Prober(server.url, None, 120.0, asyncio.run(server_forcing(server.url)))
        p.n = 10_000  # prompts unlike the calibration's (their first word numbers them)

        async def workload_pair() -> None:
            for _ in range(2):
                sent.append(await p.one(sizes[len(sent) % len(sizes)], 24))

        async def run() -> tuple:
            try:
                return await measure(server.url, prompt_words=(16, 128, 512), long_words=1024, repeats=5,
                                     decode_tokens=24, between=workload_pair)
            finally:
                p.pool.close()

        samples, batches = asyncio.run(run())
    assert not batches  # llama.cpp's server runs one request at a time
    rounds = [sent[i:i + len(sizes)] for i in range(0, len(sent), len(sizes))]
    assert len(rounds) == 5 and all(len(rs) == len(sizes) for rs in rounds)
    assert all(r.output_tokens == 24 for r in sent)  # forced (logit_bias)
    coef, overhead = fit(samples, batches=False)
    reqs = [SimRequest(arrival=100.0 * i, prompt_tokens=r.input_tokens or n, output_tokens=24)  # tokens, as fitted
            for i, (n, r) in enumerate(zip(sizes, rounds[0], strict=True))]
    sim = simulate(reqs, SimConfig(timing="linear", linear=coef, jitter=0.0, max_num_seqs=1))
    per_size = list(zip(*rounds, strict=True))  # size -> its request in every round
    r_ttft = statistics.median(statistics.median(r.ttft for r in rs) for rs in per_size)
    r_tpot = statistics.median(statistics.median(r.tpot for r in rs) for rs in per_size)
    s_ttft = statistics.median(s.ttft for s in sim) + overhead / 1e3
    s_tpot = statistics.median(s.tpot for s in sim)
    print("llama.cpp", {"ttft_real": r_ttft, "ttft_sim": s_ttft, "tpot_real": r_tpot, "tpot_sim": s_tpot},
          coef, overhead)
    assert abs(s_ttft - r_ttft) / r_ttft < 0.10, (r_ttft, s_ttft, coef, samples)
    assert abs(s_tpot - r_tpot) / r_tpot < 0.10, (r_tpot, s_tpot, coef, samples)
