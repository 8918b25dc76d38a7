"""`slogate sim calibrate` against real servers: a sim with hidden linear constants, and llama.cpp."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from slogate.replay.sim import calibrate as calibrate_module
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


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
@pytest.mark.parametrize("jitter", [0.02, 0.8])
def test_the_cli_reports_how_far_requests_lie_from_the_model(tmp_path, capsys, jitter):
    """`slogate sim calibrate` prints and writes how far the design requests lie from the fitted model;
    on a server whose speed moves (80 % step jitter) it warns that the calibration is noisy."""
    from slogate.cli import main as slogate

    out = tmp_path / "cal.toml"
    with start_sim(timing="linear", seed=3, extra_args=["--linear", ",".join(map(str, HIDDEN)), "--jitter", str(jitter)]) as sim:
        assert slogate(["sim", "calibrate", "--target", sim.url, "--out", str(out), "--prompt-tokens", "16,128,512",
                        "--batches", "1,4", "--long-context", "512", "--repeats", "2"]) == 0
    err = capsys.readouterr().err
    ttft = re.search(r"TTFT of the design requests within ([\d.]+)% of the model \(median\), ([\d.]+)% \(p90\)", err)
    tpot = re.search(r"TPOT of the design requests within ([\d.]+)% of the model \(median\)", err)
    assert ttft and tpot, err
    assert f"# TTFT of the design requests within {ttft.group(1)}%" in out.read_text()
    if jitter < 0.1:
        assert float(ttft.group(1)) < 3 and float(tpot.group(1)) < 3 and "warning" not in err, err
    else:
        assert max(float(ttft.group(1)), float(tpot.group(1))) > 10 and "warning: the median request is" in err, err


def test_long_context_0_sends_no_long_context_point(capsys):
    """`--long-context 0`: the design is the prompt sizes alone (their own decodes give the context cost);
    a negative one is refused with the fix."""
    from slogate.cli import main as slogate

    with start_sim(timing="constant", ttft_ms=5, itl_ms=2) as sim:
        samples, _ = asyncio.run(measure(sim.url, prompt_words=(16, 64), long_words=0, batches=(1,), repeats=2,
                                         decode_tokens=4))
    assert sorted({s.new_tokens for s in samples if s.kind == "prefill"}) == [16, 64]
    assert max(s.kv_tokens for s in samples if s.seqs == 1) < 100  # no decode at a long context
    assert slogate(["sim", "calibrate", "--target", "http://127.0.0.1:1", "--long-context", "-1"]) == 2
    assert "--long-context -1 is negative" in capsys.readouterr().err


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


def test_a_negative_context_cost_is_held_at_zero():
    """Decode steps a little faster at longer contexts (load noise; llama.cpp's are flat) would fit a
    negative D; D is held at 0 and B, the prefill's cost per token, still comes out right."""
    rows = [Sample("prefill", n, 1, n, 40.0 + 8.0 * n) for n in (20, 165, 660) for _ in range(3)]
    rows += [Sample("decode", 1, 1, kv, 60.0 - 0.004 * kv) for kv in (32, 177, 672, 1340) for _ in range(3)]
    coef, _ = fit(rows, batches=False)
    assert coef.d_ms == 0.0 and coef.b_ms == pytest.approx(8.0, rel=0.02), coef


def test_fit_follows_the_typical_request_not_a_slow_third(monkeypatch):
    """A TTFT curved upward by attention, as llama.cpp's is, and a third of the requests 30 % slow (a
    shared machine), three of the five at one size (llama.cpp's 256-word point, 2026-12-05): the median
    line through every request finds B and E within 3 %; least squares through each size's median (the
    fit before) sees the slow size as a downward curve, keeps a straight line, and misses the middle
    sizes by more than 10 %."""
    def ttft(n: float) -> float:
        return 40.0 + 8.0 * n + 0.006 * n * n / 2

    slow = {(256, 0), (256, 2), (256, 4), (16, 1), (128, 3), (512, 2)}  # (size, round): 6 of 20
    # counted prompt tokens: each prompt's numbered first word adds 3 or 4 tokens to its size in words
    rows = [Sample("prefill", n + 3 + r % 2, 1, n + 3 + r % 2, ttft(n + 3 + r % 2) * (1.3 if (n, r) in slow else 1.0))
            for r in range(5) for n in (16, 128, 256, 512)]
    rows += [Sample("decode", 1, 1, kv, 30.0 + 0.002 * kv) for kv in (28, 140, 268, 524, 1036) for _ in range(5)]
    coef, overhead = fit(rows, batches=False)
    assert coef.b_ms == pytest.approx(8.0, rel=0.03) and coef.e_ms == pytest.approx(0.006, rel=0.03), coef
    medians = [Sample("prefill", n, 1, n, statistics.median(s.step_ms for s in rows if n <= s.new_tokens <= n + 4
                                                              and s.kind == "prefill")) for n in (16, 128, 256, 512)]
    monkeypatch.setattr(calibrate_module, "LAD_ROUNDS", 1)  # one round: plain least squares
    old, old_overhead = fit(medians + rows[20:], batches=False)
    for n in (200, 300):  # the workload's middle sizes
        assert abs(_prefill_ms(coef, overhead, n) / ttft(n) - 1) < 0.03
        assert abs(_prefill_ms(old, old_overhead, n) / ttft(n) - 1) > 0.10, old


def test_counted_prompts_of_one_design_size_are_one_size():
    """With tokens counted per prompt (no usage in the stream: the server's tokenize endpoint), one design
    size's prompts differ by a token or two; the curvature check takes their median as one size."""
    rows = [Sample("prefill", n, 1, n, 1.0) for n in (19, 21, 20, 131, 132, 259, 258, 1027)]
    assert [[s.new_tokens for s in g] for g in calibrate_module._design_sizes(rows)] == [
        [19, 20, 21], [131, 132], [258, 259], [1027]]


def _prefill_ms(c, overhead: float, n: int) -> float:
    """TTFT of an n-token prompt alone on the fitted model (calibrate's own arithmetic)."""
    return calibrate_module.model_ms(c, overhead, Sample("prefill", n, 1, n, 0.0))


class LlamaFit(NamedTuple):
    """One calibration of llama.cpp and the workload replayed on both sides: the workload's medians
    (seconds) and the median over its requests of the sim's relative error on each (request by request)."""

    ttft_real: float
    ttft_sim: float
    tpot_real: float
    tpot_sim: float
    ttft_err: float
    tpot_err: float
    machine: str  # what else used the CPU meanwhile, and the hypervisor's steal
    detail: tuple


def _cpu_ticks(pid: int | str) -> int:
    """utime + stime of a process and all its threads, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _machine_ticks() -> tuple[int, int]:
    """(busy, steal) clock ticks of the whole VM since boot (/proc/stat's cpu line)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return user + nice + system + irq + softirq, steal


def _others(llama_pid: int, since: tuple[float, int, int, int, int]) -> str:
    """CPU other processes than llama.cpp and this test used over the run, and the hypervisor's steal."""
    t0, busy0, steal0, llama0, own0 = since
    busy, steal = _machine_ticks()
    wall, hz = time.monotonic() - t0, os.sysconf("SC_CLK_TCK")
    others = (busy - busy0) - (_cpu_ticks(llama_pid) - llama0) - (_cpu_ticks("self") - own0)
    return (f"other processes {others / hz / wall:.0%} of a core, steal {(steal - steal0) / hz / wall:.0%}, "
            f"over {wall:.0f} s")


# This 2-core VM changes speed by 1.4-1.9x, each speed held for seconds, with nothing else running (a
# pure-Python loop pinned to one vCPU, 2026-12-05): in one llama.cpp run a request's TTFT over the fitted
# line clustered near 1.0 and near 0.75. A median follows whichever speed most of its requests met, so
# when the design's requests and the workload's met different mixes the medians part by 10-20 % (one
# run in seven on 2026-12-05: +15 / +18 %).
# A TTFT error between 10 % and this bound is reported as an expected failure (issue 16), beyond it the
# fit is broken.
TTFT_NOISE_BOUND = 0.25
ROUNDS = 10  # of the design and the workload, interleaved
# The design's prompt sizes: four across the workload's 20-250 words. Half the sizes of Session 17's design
# (16-512 words, workload 40-500, 24 output tokens, 5 rounds) and 8 output tokens: twice the rounds in about
# the same time. With 5 rounds a size's median of five moved by up to ±15 % between runs (one slow request in
# three), and the workload's median rests on two sizes. No long-context decode point (--long-context 0): its
# 512-word prompt took a quarter of each round, and the design prompts' own decodes (contexts 11-263) span
# the workload's (27-261).
PROMPT_WORDS = (8, 64, 128, 256)
LONG_WORDS = 0
DECODE_TOKENS = 8
WORKLOAD_AFTER = (2, 2, 2, 2)


@pytest.fixture(scope="module")
def llama_fit() -> LlamaFit:
    """Calibrate on llama.cpp (one request at a time, output length forced by logit_bias), then replay
    one workload on both.

    llama.cpp's speed follows the shared machine's load (it changed up to 3x between a calibration
    and a workload run after it), so the workload is interleaved with the calibration request by
    request: in every round the 4 design requests are followed by 2, 2, 2 and 2 workload requests
    (the workload's 8 sizes). A burst of load then hits both sides alike. Even so one request of a size
    takes 0.8-1.7x another of the same size on this VM, so the workload's own median (decided by its two
    middle sizes) moved by up to ±19 % between runs of five rounds: ten rounds now, the error is taken
    request by request too (see LlamaFit), and the fit is the median line through every request
    (calibrate.fit). llama-cpp-python streams no usage, so the prober counts each prompt on the server's
    /extras/tokenize: the fit is per token, as the sim's requests are (the numbered first word is 3-4
    tokens in the design and 7 in the workload; counted as one word it put the workload 4 tokens, ~45 ms,
    above the line). One core for llama.cpp: prefilling on both (--n_threads_batch 2) took 3.4 min alone
    and matched as well, but 5.4 min in CI with TTFT -15 % (one run each way, Session 17).
    """
    from slogate.replay.sim.calibrate import Prober, fit, server_forcing
    from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
    from tests.realservers import start_llama

    sizes = [20, 60, 150, 30, 100, 250, 40, 125]
    sent: list = []  # workload records in send order: round r holds sent[8r : 8r + 8]

    with start_llama() as server:
        since = (time.monotonic(), *_machine_ticks(), _cpu_ticks(server.proc.pid), _cpu_ticks("self"))
        p = Prober(server.url, None, 120.0, asyncio.run(server_forcing(server.url)))
        p.n = 10_000  # prompts unlike the calibration's (their first word numbers them)

        calls = 0

        async def workload_share() -> None:
            nonlocal calls
            for _ in range(WORKLOAD_AFTER[calls % len(WORKLOAD_AFTER)]):
                sent.append(await p.one(sizes[len(sent) % len(sizes)], DECODE_TOKENS))
            calls += 1

        async def run() -> tuple:
            try:
                return await measure(server.url, prompt_words=PROMPT_WORDS, long_words=LONG_WORDS, repeats=ROUNDS,
                                     decode_tokens=DECODE_TOKENS, between=workload_share)
            finally:
                await p.close()

        samples, batches = asyncio.run(run())
        machine = _others(server.proc.pid, since)
    assert not batches  # llama.cpp's server runs one request at a time
    rounds = [sent[i:i + len(sizes)] for i in range(0, len(sent), len(sizes))]
    assert len(rounds) == ROUNDS and all(len(rs) == len(sizes) for rs in rounds)
    assert all(r.output_tokens == DECODE_TOKENS for r in sent)  # forced (logit_bias)
    # no usage in llama-cpp-python's streams: its /extras/tokenize counted each prompt (<bos>, the first word
    # q1000Nx in 7 tokens, one per filler word), so the fit's B and the sim's requests are per token
    assert all(r.input_tokens == sizes[i % len(sizes)] + 7 for i, r in enumerate(sent)), [r.input_tokens for r in sent]
    coef, overhead = fit(samples, batches=False)
    reqs = [SimRequest(arrival=100.0 * i, prompt_tokens=r.input_tokens or n, output_tokens=DECODE_TOKENS)  # tokens, as fitted
            for i, (n, r) in enumerate(zip(sizes, rounds[0], strict=True))]
    sim = simulate(reqs, SimConfig(timing="linear", linear=coef, jitter=0.0, max_num_seqs=1))
    per_size = list(zip(*rounds, strict=True))  # size -> its request in every round
    sim_ttft = [s.ttft + overhead / 1e3 for s in sim]  # per size, as `sizes`
    # Request by request: the sim's answer for its size against what llama.cpp took. The median of these
    # errors uses all 8 x ROUNDS requests; the workload's own median TTFT is decided by the two middle
    # sizes' requests (120 and 200 words), 2 x ROUNDS of them, and so carries most of llama.cpp's noise.
    got = LlamaFit(
        ttft_real=statistics.median(statistics.median(r.ttft for r in rs) for rs in per_size),
        ttft_sim=statistics.median(sim_ttft),
        tpot_real=statistics.median(statistics.median(r.tpot for r in rs) for rs in per_size),
        tpot_sim=statistics.median(s.tpot for s in sim),
        ttft_err=statistics.median(t / r.ttft - 1 for t, rs in zip(sim_ttft, per_size, strict=True) for r in rs),
        tpot_err=statistics.median(s.tpot / r.tpot - 1 for s, rs in zip(sim, per_size, strict=True) for r in rs),
        machine=machine,
        detail=(coef, overhead, samples))
    print("llama.cpp", got._replace(detail=(coef, overhead)), "samples", samples, "workload (words, real TTFTs ms, sim ms)",
          [(n, [round(r.ttft * 1e3) for r in rs], round(t * 1e3)) for n, rs, t in zip(sizes, per_size, sim_ttft, strict=True)])
    return got


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(1500)  # 712 s at load average 10-16 on the 2 shared cores
def test_calibrated_sim_matches_llama_cpp_tpot(llama_fit: LlamaFit) -> None:
    """The replayed workload's TPOT on the calibrated sim is within 10 % of llama.cpp's: request by
    request (the median of the errors) and the workload's median."""
    f = llama_fit
    assert abs(f.tpot_err) < 0.10, f
    assert abs(f.tpot_sim - f.tpot_real) / f.tpot_real < 0.10, f


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_calibrated_sim_matches_llama_cpp_ttft(llama_fit: LlamaFit) -> None:
    """TTFT within 10 %, request by request (the median of the errors) and on the workload's median.
    Between 10 % and TTFT_NOISE_BOUND it is an expected failure, with the figures (llama.cpp's own
    run-to-run noise on this VM); past the bound the calibration is broken and the test fails."""
    f = llama_fit
    errs = {"request by request": f.ttft_err, "on the workload's median": f.ttft_sim / f.ttft_real - 1}
    assert all(abs(e) < TTFT_NOISE_BOUND for e in errs.values()), f
    if any(abs(e) >= 0.10 for e in errs.values()):
        pytest.xfail("issue 16: TTFT " + ", ".join(f"{e:+.1%} {k}" for k, e in errs.items()) +
                     f" (real {f.ttft_real * 1e3:.1f} ms, sim {f.ttft_sim * 1e3:.1f} ms), inside llama.cpp's own "
                     f"noise on this VM; {f.machine}")
