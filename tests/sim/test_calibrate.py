"""`slogate sim calibrate` against real servers: a sim with hidden linear constants, and llama.cpp."""

from __future__ import annotations

import asyncio
import statistics
from typing import NamedTuple

import pytest

from slogate.replay.sim.calibrate import Sample, calibrate, fit, measure, to_toml
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


def _serial_design(ttft_ms) -> list[Sample]:
    """One-request-at-a-time design rows (as measure() gives for llama.cpp): prefills whose TTFT is
    `ttft_ms(n)`, and decodes of 30 ms + 2 µs per KV token."""
    rows = [Sample("prefill", n, 1, n, ttft_ms(n)) for n in (20, 165, 660)]
    return rows + [Sample("decode", 1, 1, kv, 30.0 + 0.002 * kv) for kv in (32, 177, 672, 1340)]


def test_fit_takes_attention_only_from_upward_curvature():
    """E (quadratic attention) is fitted when the prompts' TTFT curves upward; a downward curve (a
    burst of load on the shorter prompts of a shared machine) is noise, and the straight line stays:
    attention never makes a longer prompt cheaper per token."""
    up, _ = fit(_serial_design(lambda n: 40.0 + 7.0 * n + 0.004 * n * n / 2), batches=False)
    assert up.e_ms == pytest.approx(0.004, rel=0.05) and up.b_ms == pytest.approx(7.0, rel=0.05)
    down, _ = fit(_serial_design(lambda n: 40.0 + 9.0 * n - 0.004 * n * n / 2), batches=False)
    assert down.e_ms == 0.0 and 7.0 < down.b_ms < 9.0


class LlamaFit(NamedTuple):
    """One calibration of llama.cpp and the workload replayed on both sides (medians, seconds)."""

    ttft_real: float
    ttft_sim: float
    tpot_real: float
    tpot_sim: float
    detail: tuple


# llama.cpp's own TTFT on this 2-core VM moves by up to ±15 % between runs even pinned: a TTFT error
# between 10 % and this bound is reported as an expected failure (issue 16), beyond it the fit is broken.
TTFT_NOISE_BOUND = 0.25
ROUNDS = 5  # of the design and the workload, interleaved; each point keeps its median over them


@pytest.fixture(scope="module")
def llama_fit() -> LlamaFit:
    """Calibrate on llama.cpp (one request at a time, output length forced by logit_bias), then replay
    one workload on both.

    llama.cpp's speed follows the shared machine's load (it changed up to 3x between a calibration
    and a workload run after it), so the workload is interleaved with the calibration request by
    request: in every round each design request is followed by two workload requests (the 8 sizes
    per round of 4 design sizes), and every point keeps its median over the ROUNDS rounds. A burst of
    load then hits both sides alike. Five rounds (~3.4 min): three (~2 min) gave TTFT −3.3 / −2.1 % in
    two quiet runs but −13.3 % in a CI run on a busy box (2026-12-05); five were within 10 % in every CI
    run since 2026-12-02 (+10.4 % that day).
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
                return await measure(server.url, prompt_words=(16, 128, 512), long_words=1024, repeats=ROUNDS,
                                     decode_tokens=24, between=workload_pair)
            finally:
                p.pool.close()

        samples, batches = asyncio.run(run())
    assert not batches  # llama.cpp's server runs one request at a time
    rounds = [sent[i:i + len(sizes)] for i in range(0, len(sent), len(sizes))]
    assert len(rounds) == ROUNDS and all(len(rs) == len(sizes) for rs in rounds)
    assert all(r.output_tokens == 24 for r in sent)  # forced (logit_bias)
    coef, overhead = fit(samples, batches=False)
    reqs = [SimRequest(arrival=100.0 * i, prompt_tokens=r.input_tokens or n, output_tokens=24)  # tokens, as fitted
            for i, (n, r) in enumerate(zip(sizes, rounds[0], strict=True))]
    sim = simulate(reqs, SimConfig(timing="linear", linear=coef, jitter=0.0, max_num_seqs=1))
    per_size = list(zip(*rounds, strict=True))  # size -> its request in every round
    got = LlamaFit(
        ttft_real=statistics.median(statistics.median(r.ttft for r in rs) for rs in per_size),
        ttft_sim=statistics.median(s.ttft for s in sim) + overhead / 1e3,
        tpot_real=statistics.median(statistics.median(r.tpot for r in rs) for rs in per_size),
        tpot_sim=statistics.median(s.tpot for s in sim),
        detail=(coef, overhead, samples))
    print("llama.cpp", got._replace(detail=(coef, overhead)), "samples", samples)
    return got


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(1500)  # 712 s at load average 10-16 on the 2 shared cores
def test_calibrated_sim_matches_llama_cpp_tpot(llama_fit: LlamaFit) -> None:
    """The replayed workload's TPOT median on the calibrated sim is within 10 % of llama.cpp's."""
    f = llama_fit
    assert abs(f.tpot_sim - f.tpot_real) / f.tpot_real < 0.10, f


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_calibrated_sim_matches_llama_cpp_ttft(llama_fit: LlamaFit) -> None:
    """TTFT median within 10 % (+3.1 % on a quiet run). Between 10 % and TTFT_NOISE_BOUND it is an
    expected failure, with the figures (llama.cpp's own run-to-run noise on this VM: +10.4 % once in
    CI, 2026-12-02); past the bound the calibration is broken and the test fails."""
    f = llama_fit
    err = (f.ttft_sim - f.ttft_real) / f.ttft_real
    assert abs(err) < TTFT_NOISE_BOUND, f
    if abs(err) >= 0.10:
        pytest.xfail(f"issue 16: TTFT {err:+.1%} off, inside llama.cpp's own noise on this VM "
                     f"(real {f.ttft_real * 1e3:.1f} ms, sim {f.ttft_sim * 1e3:.1f} ms)")
