"""Public per-request ground truth of real engines, replayed through the simulator in virtual time.

Reads only files in tests/bench/ground_truth/ (never the network); returns per-load error rows and
per-batch decode steps that the fidelity bench prints and tests/sim/test_fidelity.py asserts on.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import statistics
from collections import defaultdict
from pathlib import Path

import msgspec

from slogate.replay.sim.catalog import find_gpu, find_model
from slogate.replay.sim.config import build, step_model
from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
from slogate.traces.metrics import percentile

DIR = Path(__file__).resolve().parents[1] / "bench/ground_truth"
DISTSERVE = DIR / "distserve_vllm_opt13b_a100.csv"
# The real engine's KV capacity. vLLM logs it at start-up ("# GPU blocks: N"), but the published
# runs come without the log. The three saturated runs (3, 3.5 and 4 req/s) each peak at 3,496-3,522
# blocks in use (peak_blocks_in_use, from the client-side timeline), where V0 stops admitting with
# 1 % of the blocks free (its watermark): 3,555 blocks. The simulator's memory rule gives 3,806
# (7 % more): vLLM's profiling run reserved about 3 GiB more than the rule's 1.5 GiB here.
DISTSERVE_KV_BLOCKS = 3555
# vLLM (V0, 2024) serving OPT-13B on one A100-80GB, ShareGPT prompts, Poisson arrivals; DistServe
# artifact (LLMServe/DistServe @20a1633, Apache-2.0), see tests/bench/ground_truth/README.md. Prefix
# caching off: V0's EngineArgs.enable_prefix_caching defaulted to False (a preempted request recomputes
# its whole prompt; with caching on, the sim found its own freed blocks again)
DISTSERVE_CONFIG = SimConfig(gpu="a100-80g", model="opt-13b", scheduler="v0", seed=0,
                             kv_blocks=DISTSERVE_KV_BLOCKS, prefix_caching=False)


def load(path: Path = DISTSERVE) -> dict[float, list[dict]]:
    """Requests by load level (req/s): arrival_s, prompt_tokens, output_tokens, ttft_ms, tpot_ms."""
    runs: dict[float, list[dict]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            runs[float(row["rate_req_s"])].append({k: float(v) for k, v in row.items()})
    return dict(runs)


def peak_blocks_in_use(reqs: list[dict], step_s: float = 0.1, block_size: int = 16) -> int:
    """The most KV blocks the real engine held at once, from what the client saw: a request holds
    its prompt plus the tokens generated so far from its first token (arrival + TTFT) until its last
    (one TPOT per token); sampled every step_s."""
    spans = []
    for r in reqs:
        start = r["arrival_s"] + r["ttft_ms"] / 1e3
        tpot = r["tpot_ms"] / 1e3
        spans.append((start, start + tpot * (r["output_tokens"] - 1), int(r["prompt_tokens"]), tpot))
    end = max(e for _, e, _, _ in spans)
    peak, t = 0, 0.0
    while t <= end:
        used = 0
        for start, stop, prompt, tpot in spans:
            if start <= t <= stop:
                generated = 1 + int((t - start) / tpot) if tpot > 0 else 1
                used += -(-(prompt + generated) // block_size)
        peak = max(peak, used)
        t += step_s
    return peak


class DecodeStep(msgspec.Struct):
    """One request's decode seen from the client: the mean step between its tokens once the V0
    prefill steps of other prompts (those whose first token falls inside its decode) are taken out."""

    batch: float  # mean number of requests decoding over its decode span
    step_ms: float


def decode_steps(reqs: list[dict], ttft_s: list[float], tpot_s: list[float], config: SimConfig = DISTSERVE_CONFIG,
                 min_output_tokens: int = 20) -> list[DecodeStep]:
    """Per request (at least min_output_tokens): (decode span − prefill steps inside it) / (tokens − 1).
    Prefill steps are priced by the config's step model without jitter (the same estimate for the real
    and the simulated side, so its error cancels in the comparison); batches come from the timeline."""
    prefill = step_model(build(msgspec.structs.replace(config, jitter=0.0)), 0)
    first = [r["arrival_s"] + t for r, t in zip(reqs, ttft_s, strict=True)]
    spans = [(f, f + tp * (r["output_tokens"] - 1)) for r, f, tp in zip(reqs, first, tpot_s, strict=True)]
    order = sorted(range(len(reqs)), key=first.__getitem__)
    firsts = [first[j] for j in order]
    out = []
    for r, (start, stop) in zip(reqs, spans, strict=True):
        if r["output_tokens"] < min_output_tokens:
            continue
        lo, hi = bisect.bisect_right(firsts, start), bisect.bisect_right(firsts, stop)
        n = [int(reqs[order[k]]["prompt_tokens"]) for k in range(lo, hi)]
        stall = sum(prefill(p, 1, p, p * p / 2) for p in n)
        points = [start + (stop - start) * k / 10 for k in range(11)]
        batch = statistics.mean(sum(1 for a, b in spans if a <= t <= b) for t in points)
        out.append(DecodeStep(batch=batch, step_ms=1e3 * (stop - start - stall) / (r["output_tokens"] - 1)))
    return out


def decode_by_batch(rate: float, bins: tuple[int, ...] = (0, 10, 20, 30, 40, 50, 60, 80),
                    config: SimConfig = DISTSERVE_CONFIG) -> list[dict]:
    """Real vs simulated decode step (median ms) by the real run's batch, same requests on both sides."""
    reqs = load()[rate]
    sim = simulate([SimRequest(arrival=r["arrival_s"], prompt_tokens=int(r["prompt_tokens"]),
                               output_tokens=int(r["output_tokens"])) for r in reqs], config)
    real = decode_steps(reqs, [r["ttft_ms"] / 1e3 for r in reqs], [r["tpot_ms"] / 1e3 for r in reqs], config)
    got = decode_steps(reqs, [s.ttft for s in sim], [s.tpot or 0.0 for s in sim], config)
    by_bin: dict[int, list[tuple[DecodeStep, DecodeStep]]] = defaultdict(list)
    for a, b in zip(real, got, strict=True):
        by_bin[bisect.bisect_right(bins, a.batch) - 1].append((a, b))
    rows = []
    for k, pairs in sorted(by_bin.items()):
        a = statistics.median(p[0].step_ms for p in pairs)
        b = statistics.median(p[1].step_ms for p in pairs)
        rows.append({"batch": f"{bins[k]}-{bins[k + 1]}" if k + 1 < len(bins) else f"{bins[k]}+", "requests": len(pairs),
                     "batch_real": round(statistics.mean(p[0].batch for p in pairs), 1),
                     "batch_sim": round(statistics.mean(p[1].batch for p in pairs), 1),
                     "step_real_ms": round(a, 1), "step_sim_ms": round(b, 1), "err_pct": round(100 * (b - a) / a, 1)})
    return rows


def _pct(xs: list[float], q: float) -> float:
    return percentile(sorted(xs), q)


def compare(config: SimConfig = DISTSERVE_CONFIG, path: Path = DISTSERVE) -> list[dict]:
    """Per load level: real and simulated TTFT/TPOT p50 and p90 (ms) and the relative errors (%)."""
    rows = []
    for rate, reqs in sorted(load(path).items()):
        sim = simulate([SimRequest(arrival=r["arrival_s"], prompt_tokens=int(r["prompt_tokens"]),
                                   output_tokens=int(r["output_tokens"])) for r in reqs], config)
        row: dict = {"rate_req_s": rate, "requests": len(reqs)}
        for metric in ("ttft", "tpot"):
            real = [r[f"{metric}_ms"] for r in reqs if metric == "ttft" or r["output_tokens"] > 1]
            got = [1e3 * getattr(s, metric) for s in sim if getattr(s, metric) is not None]
            for q in (50, 90):
                a, b = _pct(real, q), _pct(got, q)
                row[f"{metric}_p{q}_real_ms"] = round(a, 1)
                row[f"{metric}_p{q}_sim_ms"] = round(b, 1)
                row[f"{metric}_p{q}_err_pct"] = round(100 * (b - a) / a, 1)
        rows.append(row)
    return rows


KNEE_TTFT_P90_MS = 1000.0


def knee(rows: list[dict], side: str) -> float | None:
    """The load (req/s) where TTFT p90 crosses 1 s, log-interpolated between measured levels."""
    import math

    key = f"ttft_p90_{side}_ms"
    for lo, hi in itertools.pairwise(rows):
        a, b = lo[key], hi[key]
        if a < KNEE_TTFT_P90_MS <= b:
            f = math.log(KNEE_TTFT_P90_MS / a) / math.log(b / a)
            return lo["rate_req_s"] + f * (hi["rate_req_s"] - lo["rate_req_s"])
    return None


def slower_gpu(factor: float, config: SimConfig = DISTSERVE_CONFIG) -> SimConfig:
    """The replay config on a GPU whose work takes `factor` times as long (HBM bandwidth and peak
    FLOPs both divided by it; the fixed per-step CPU time is kept): a run-to-run engine speed."""
    gpu = find_gpu(config.gpu)
    return msgspec.structs.replace(config, gpu_set={"hbm_tb_s": gpu.hbm_tb_s / factor,
                                                    "bf16_tflops": gpu.bf16_tflops / factor})


# Issue 16's bounds (%): medians within 10, p90s within 20 (knee: within 10), on every ground truth here.
BOUND_PCT = {50: 10.0, 90: 20.0}


def out_of_bounds(rows: list[dict], rates: tuple[float, ...] | None = None) -> list[str]:
    """Issue 16's bounds on a compare() table: medians within 10 %, p90s within 20 % at `rates` (None:
    every rate but 2 req/s, whose engine was slower, tests/bench/ground_truth/README.md), and the knee
    (from every row) within 10 %. Each miss as a short line; none: every bound met."""
    out = [f"{r['rate_req_s']:g} {m} p{q} {r[f'{m}_p{q}_err_pct']:+.0f}%" for r in rows
           if (r["rate_req_s"] in rates if rates is not None else r["rate_req_s"] != 2.0)
           for m in ("ttft", "tpot") for q, bound in BOUND_PCT.items() if abs(r[f"{m}_p{q}_err_pct"]) > bound]
    k_real, k_sim = knee(rows, "real"), knee(rows, "sim")
    if not (k_real and k_sim and abs(k_sim - k_real) / k_real <= 0.10):
        out.append(f"knee {k_real} vs {k_sim}")
    return out


def speed_capacity_grid(factors: tuple[float, ...] = (0.97, 1.0, 1.02, 1.04, 1.06),
                        blocks: tuple[int, ...] = (3250, 3380, 3500, 3555, 3650, 3806)) -> list[dict]:
    """The whole table's out-of-bound rows for each engine speed (slower_gpu) and KV capacity."""
    return [{"kv_blocks": b, "gpu_slower": f,
             "out_of_bounds": out_of_bounds(compare(msgspec.structs.replace(slower_gpu(f), kv_blocks=b)))}
            for b in blocks for f in factors]


# vLLM's CI latency test (.buildkite nightly benchmarks, latency-tests.json: batch 8, 32 in / 128 out):
# published E2E seconds (DESIGN §6); the V1 scheduler must stay within 10 % of each.
CI_LATENCY = (("h100-sxm", "llama-3-8b", 1, 1.0), ("h200", "llama-3-8b", 1, 0.83), ("h100-sxm", "llama-3-70b", 4, 2.44))


def ci_latency() -> list[dict]:
    """The simulated E2E of vLLM's CI latency test next to the published figure."""
    rows = []
    batch = [SimRequest(arrival=0.0, prompt_tokens=32, output_tokens=128) for _ in range(8)]
    for gpu, model, tp, ref in CI_LATENCY:
        e2e = max(r.e2e for r in simulate(batch, SimConfig(gpu=gpu, model=model, tp=tp)))
        rows.append({"check": f"E2E {model} TP{tp} {gpu}, batch 8, 32→128", "published": ref,
                     "simulated": round(e2e, 3), "error_pct": round(100 * (e2e - ref) / ref, 1)})
    return rows


# vLLM (the mid-2024 V0 engine, 0.5.3-0.6) offline batches on ALCF's A100-40GB (Polaris), H100 and GH200:
# B prompts of L random tokens, L output tokens each (ignore_eos), whole-batch latency; LLM-Inference-Bench
# (argonne-lcf/LLM-Inference-Bench, BSD-3-Clause), see tests/bench/ground_truth/README.md.
ARGONNE = DIR / "argonne_vllm_offline_batch.csv"
ARGONNE_GPUS = {"Nvidia A100 GPU": "a100-40g", "Nvidia H100 GPU": "h100-sxm", "Nvidia GH200 GPU": "gh200"}
ARGONNE_MODELS = {"meta-llama/Meta-Llama-3-8B": "llama-3-8b", "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
                  "meta-llama/Llama-2-7b-hf": "llama-2-7b", "mistralai/Mistral-7B-v0.1": "mistral-7b",
                  "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b"}


# vLLM's host work per step on these machines (ms per step, µs per sequence, ns per KV token), each read
# off one setup where the GPU step is shortest, the others held out. H100: Llama-3-8B on 4 GPUs decodes at
# 5.9 ms per token at batch 1 whatever the length, ~9.7 ms per step at batch 64 with 128-token prompts
# and ~15.7 ms with 2048 (each less its prefill), so 6 ms + 60 µs per sequence + 30 ns per KV token.
# A100-40GB (Polaris): Llama-2-7B on 4 GPUs, 6.2 ms at batch 1, ~13.2 ms at batch 64 with 128 tokens:
# 6.2 ms + 100 µs, the KV term kept. GH200 has no multi-GPU rows to read it from: it borrows the H100's.
OFFLINE_HOST_FLOOR = {"h100-sxm": (6.0, 60.0, 30.0), "gh200": (6.0, 60.0, 30.0), "a100-40g": (6.2, 100.0, 30.0)}
OFFLINE_FLOOR_SETUPS = (("h100-sxm", "llama-3-8b", 4), ("a100-40g", "llama-2-7b", 4))  # what the floors come from


def offline_config(gpu: str, model: str, tp: int, host: bool = True) -> SimConfig:
    """The replay config of one LLM-Inference-Bench setup: that vLLM's defaults (fp16 weights, no prefix
    caching, chunked prefill off below 32K context, so a step's token budget is max(max_model_len, 2048)).
    Its step time is the V1 step model (not 0.2's serial 4.8 ms of CPU per step, --scheduler v0) with the
    machine's host floor (host=False: without it, the simulator's default)."""
    step_ms, seq_us, kv_ns = OFFLINE_HOST_FLOOR[gpu] if host else (0.0, 0.0, 0.0)
    return SimConfig(gpu=gpu, model=model, tp=tp, dtype="fp16", prefix_caching=False, seed=0,
                     max_num_batched_tokens=max(find_model(model).max_context, 2048),
                     host_step_ms=step_ms, host_seq_us=seq_us, host_kv_ns=kv_ns)


def offline_batches(path: Path = ARGONNE, config=offline_config) -> list[dict]:
    """Every published offline batch next to the simulated one: the whole batch's latency (s) and the
    relative error (%). `config(gpu, model, tp)` gives the replay config (offline_config by default)."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            gpu, model, tp = ARGONNE_GPUS[row["hardware"]], ARGONNE_MODELS[row["model"]], int(row["gpus"])
            n_in, n_out, batch = int(row["input_tokens"]), int(row["output_tokens"]), int(row["batch_size"])
            reqs = [SimRequest(arrival=0.0, prompt_tokens=n_in, output_tokens=n_out) for _ in range(batch)]
            sim = simulate(reqs, config(gpu, model, tp))
            got, real = max(r.e2e for r in sim), float(row["latency_s"])
            out.append({"gpu": gpu, "model": model, "tp": tp, "batch": batch, "tokens": n_in,
                        "real_s": real, "sim_s": round(got, 3), "err_pct": round(100 * (got - real) / real, 1)})
    return out


def offline_in_bounds(cell: dict) -> bool:
    """Issue 16's bounds on one offline_summary cell: median error ≤ 10 %, p90 |error| ≤ 20 %."""
    return abs(cell["median_err_pct"]) <= BOUND_PCT[50] and cell["p90_abs_err_pct"] <= BOUND_PCT[90]


def offline_summary(rows: list[dict]) -> list[dict]:
    """Per setup (GPU, model, TP) and batch size: the median error over the five lengths (128-2048
    tokens in and out) and the p90 of |error|; issue 16's bounds are median ≤ 10 %, p90 ≤ 20 %."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["gpu"], r["model"], r["tp"], r["batch"])].append(r["err_pct"])
    return [{"gpu": g, "model": m, "tp": tp, "batch": b, "runs": len(errs),
             "median_err_pct": round(statistics.median(errs), 1),
             "p90_abs_err_pct": round(_pct([abs(e) for e in errs], 90), 1)}
            for (g, m, tp, b), errs in sorted(groups.items())]
