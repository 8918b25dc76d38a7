"""How long one engine step takes: the roofline model of DESIGN §6 and a fitted linear model.

A step model is a pure function of the step's shape (new tokens, sequences, KV tokens read,
attention work) plus seeded jitter. It never looks at requests, clocks or the network.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgspec

from slogate.replay.sim.catalog import Gpu, Model, gemm_speedup, precision
from slogate.traces.usage import UsageError

# Roofline efficiencies (DESIGN §6 fits, checked against vLLM's CI latency test on H100/H200)
HBM_EFF_WEIGHTS = 0.73  # fraction of HBM bandwidth reached streaming the weights
HBM_EFF_KV = 0.70  # … and reading the paged KV cache in decode (FlashAttention backend), see below
HBM_EFF_KV_V0 = 0.51  # … the same with --scheduler v0 (vLLM 0.2's PagedAttention kernel; the DistServe fit)
STEP_OVERHEAD_S = 0.13e-3  # per step: launch + sampler (V1, CUDA graphs)
LAYER_OVERHEAD_S = 32e-6  # per layer: kernel launches and norms
SEQ_OVERHEAD_S = 4.4e-6  # per sequence in the batch: metadata, sampling

# What the plain roofline leaves out, checked against DistServe's published vLLM profile of OPT-13B on
# one A100-80GB (LLMServe/DistServe simdistserve/estimators/profile_data/profiler-a100-80g.vllm.json,
# Apache-2.0): prefill ms = 22.05 + 0.1405·Σn + 8.08e-6·Σn², decode ms = 23.48 + 0.000593·Σctx
# + 0.0607·B (B < 95), 20.2 + 0.00049·Σctx + 0.120·B (B ≥ 95). See replay/sim/README.md.
# 1. Weight streaming and GEMM math do not overlap: both fits are intercept (≈ weight read) PLUS a
#    per-token slope, so a step costs T_mem + T_gemm, not their max. This is what makes small
#    prefill chunks inefficient (each pays the whole weight read) and gives decode its per-sequence
#    slope (0.127 ms/seq at A100 MFU 0.65 vs the profile's 0.120 for large batches).
# 2. Attention runs far below peak: the quadratic prefill term 8.08e-6 ms/token² is 4·L·H·d/2 FLOPs
#    at 16 % of A100 peak. Decode attention (n = 1) is linear in the context and memory-bound (KV read).
ATTN_EFF = 0.16
# 3. V0's Python scheduler, sampler and detokenizer run between GPU steps (vLLM's V1 announcement,
#    Jan 2025, names V0's CPU overhead as the reason for V1's rewrite): the decode intercept 23.48 ms
#    less the 18.7 ms roofline step. V1 overlaps that work with the GPU (its CI latency matches without it).
V0_STEP_CPU_S = 4.8e-3
# 4. The KV read of decode: 0.70 of HBM bandwidth reproduces LLM-Inference-Bench's vLLM (2024) offline
#    batches at one GPU (argonne-lcf/LLM-Inference-Bench, BSD-3-Clause; tests/bench/ground_truth/): at 0.51 the
#    simulated batch latency grew 3 → 22 % too long from 128 to 2048 tokens of context (H100, Llama-3-8B,
#    batch 64) and to +34 % with Llama-2-7B's 4× larger multi-head KV; at 0.70 every one-GPU Llama setup on
#    A100-40GB, H100 and GH200 is within −11 … +14 % by median. The V1 CI anchors (32-token prompts) do
#    not move. --scheduler v0 keeps 0.51: the DistServe replay (vLLM 0.2, its own kernel) is fitted with it.
TWO_PI = math.tau  # random.gauss's TWOPI


class StepShape(msgspec.Struct):
    """What one step computes: the inputs of every step model. The models take floats: the engine
    passes whole counts, a mean-field estimate may pass fractional ones (the compiled build checks
    argument types, so the annotations say what is accepted)."""

    new_tokens: int  # prompt chunk tokens + one per decoding sequence
    seqs: int  # sequences in the batch (B)
    kv_tokens: int  # sum over sequences of (context + new tokens): KV bytes read
    attn_work: float  # sum over sequences of n * (c + n/2): attention FLOP term


class Roofline:
    """T_step = overhead(B) + T_mem + T_gemm + T_attn + T_comm(TP), times jitter.

    T_mem = weights (MoE: the experts the step's tokens route to) + KV read at their HBM efficiencies;
    T_gemm = 2·P_active·N FLOPs at MFU;
    T_attn = 4·L·H·d·Σ n(c + n/2) FLOPs at 16 % of peak (prefill attention is quadratic in the
    chunk); overhead = launch costs, plus V0's CPU scheduling time when scheduler="v0". A host floor
    (host_step_s + host_seq_s·B + host_kv_s·KV tokens, default off) bounds the step from below: host work
    that overlaps the GPU (scheduling, inputs and block tables, outputs).
    """

    def __init__(self, gpu: Gpu, model: Model, *, tp: int = 1, dtype: str = "bf16",
                 kv_bytes: float = 2.0, jitter: float = 0.02, seed: int = 0, scheduler: str = "v1",
                 host_step_s: float = 0.0, host_seq_s: float = 0.0, host_kv_s: float = 0.0) -> None:
        if tp < 1:
            raise UsageError(f"--tp must be at least 1, got {tp}")
        prec = precision(dtype)
        b_w, speedup = prec.weight_bytes, gemm_speedup(prec, gpu)
        bw = gpu.hbm_tb_s * 1e12
        peak = gpu.bf16_tflops * 1e12 * tp
        flops = peak * gpu.mfu
        kv_heads = max(model.kv_heads, tp)  # heads are replicated when TP exceeds them
        kv_tok = 2 * model.layers * kv_heads * model.head_dim * kv_bytes
        self.weight_s_per_b = 1e9 * b_w / tp / (bw * HBM_EFF_WEIGHTS)  # seconds per billion parameters read
        self.t_weights = model.params_b * self.weight_s_per_b
        self.moe: Model | None = model if model.experts else None  # weights read depend on the step's tokens
        self.kv_coef = kv_tok / tp / (bw * (HBM_EFF_KV_V0 if scheduler == "v0" else HBM_EFF_KV))
        self.lin_coef = 2 * model.active_b * 1e9 / (flops * speedup)
        self.attn_coef = 4 * model.layers * model.heads * model.head_dim / (peak * ATTN_EFF)
        self.t_fixed = STEP_OVERHEAD_S + LAYER_OVERHEAD_S * model.layers
        if scheduler == "v0":
            self.t_fixed += V0_STEP_CPU_S
        if tp > 1:  # two all-reduces per layer: fixed latency + ring traffic of the activations
            self.comm_fixed = 2 * model.layers * gpu.link_latency_us * 1e-6
            self.comm_coef = 2 * model.layers * 2 * (tp - 1) / tp * model.hidden * 2 / (gpu.link_gb_s * 1e9)
        else:
            self.comm_fixed = self.comm_coef = 0.0
        if min(host_step_s, host_seq_s, host_kv_s) < 0:
            raise UsageError(f"host time per step must be ≥ 0, got {host_step_s * 1e3} ms + "
                             f"{host_seq_s * 1e6} µs/seq + {host_kv_s * 1e9} ns/KV token")
        self.host_step_s, self.host_seq_s, self.host_kv_s = host_step_s, host_seq_s, host_kv_s
        self.host_floor = host_step_s > 0 or host_seq_s > 0 or host_kv_s > 0
        self.host_bound = 0  # steps the host floor set (`slogate plan` names the binding limit by it)
        self.jitter = jitter
        self._rng = random.Random(seed)
        self._spare: float | None = None  # the second normal of the last Box–Muller pair

    def _gauss(self) -> float:
        """A standard normal: random.gauss's own Box–Muller pairs, from the same stream (decode_run
        inlines it, so both paths draw the very same values)."""
        z = self._spare
        if z is not None:
            self._spare = None
            return z
        rnd = self._rng.random
        x2pi = rnd() * TWO_PI
        g2rad = math.sqrt(-2.0 * math.log(1.0 - rnd()))
        self._spare = math.sin(x2pi) * g2rad
        return math.cos(x2pi) * g2rad

    def weights_s(self, new_tokens: float) -> float:
        """Time to stream the weights a step over `new_tokens` tokens reads (MoE: the experts routed to)."""
        moe = self.moe
        return self.t_weights if moe is None else moe.weights_read_b(new_tokens) * self.weight_s_per_b

    def __call__(self, new_tokens: float, seqs: float, kv_tokens: float, attn_work: float) -> float:
        t_mem = self.weights_s(new_tokens) + kv_tokens * self.kv_coef
        t = (self.t_fixed + SEQ_OVERHEAD_S * seqs + t_mem + new_tokens * self.lin_coef
             + attn_work * self.attn_coef)
        if self.comm_fixed:
            t += self.comm_fixed + self.comm_coef * new_tokens
        if self.host_floor:  # the GPU waits for the host: a step is never shorter than its host work
            host = self.host_step_s + self.host_seq_s * seqs + self.host_kv_s * kv_tokens
            if host > t:
                t = host
                self.host_bound += 1
        if self.jitter:
            t *= 1.0 + self.jitter * max(-3.0, min(3.0, self._gauss()))
        return t

    def decode_run(self, t: float, seqs: int, kv_tokens: int, attn_work: float, steps: int, horizon: float
                   ) -> list[float]:
        """End times of up to `steps` consecutive decode steps of `seqs` sequences from t (each step
        reads `seqs` more KV tokens than the one before), stopping after the first ending at or past
        `horizon`: the same arithmetic and jitter draws as calling the model once per step."""
        kv_coef, attn_coef, seq_t = self.kv_coef, self.attn_coef, SEQ_OVERHEAD_S * seqs
        fixed, weights, lin = self.t_fixed, self.weights_s(seqs), seqs * self.lin_coef
        comm_fixed, comm = self.comm_fixed, self.comm_fixed + self.comm_coef * seqs
        floor, host, host_kv = self.host_floor, self.host_step_s + self.host_seq_s * seqs, self.host_kv_s
        jitter, rnd, spare = self.jitter, self._rng.random, self._spare
        log, sqrt, sin, cos = math.log, math.sqrt, math.sin, math.cos
        times: list[float] = []
        bound = 0
        for _ in range(steps):
            dt = fixed + seq_t + (weights + kv_tokens * kv_coef) + lin + attn_work * attn_coef
            if comm_fixed:
                dt += comm
            if floor and dt < host + host_kv * kv_tokens:
                dt = host + host_kv * kv_tokens
                bound += 1
            if jitter:  # self._gauss() and max(-3.0, min(3.0, g)), inlined (one step per token)
                if spare is None:
                    x2pi = rnd() * TWO_PI
                    g2rad = sqrt(-2.0 * log(1.0 - rnd()))
                    g, spare = cos(x2pi) * g2rad, sin(x2pi) * g2rad
                else:
                    g, spare = spare, None
                dt *= 1.0 + jitter * (g if -3.0 <= g <= 3.0 else (3.0 if g > 3.0 else -3.0))
            t += dt
            times.append(t)
            if t >= horizon:
                break
            kv_tokens += seqs
            attn_work += seqs
        self._spare = spare
        self.host_bound += bound
        self.last_dt = dt  # the last step's duration as __call__ would return it (busy-time accounting)
        return times


class LinearCoefficients(msgspec.Struct, frozen=True):
    """T_step (ms) = a + b·new_tokens + c·seqs + d·kv_tokens + e·attn_work.

    attn_work = Σ n·(c + n/2) over the step's sequences: the quadratic attention of a prompt chunk
    (visible on CPU engines such as llama.cpp, where prefill attention is a large share of the step).
    """

    a_ms: float
    b_ms: float = 0.0
    c_ms: float = 0.0
    d_ms: float = 0.0
    e_ms: float = 0.0


class Linear:
    """A linear step model with given or least-squares-fitted coefficients."""

    def __init__(self, coef: LinearCoefficients, *, jitter: float = 0.0, seed: int = 0) -> None:
        self.coef = coef
        self.jitter = jitter
        self._rng = random.Random(seed)

    def __call__(self, new_tokens: float, seqs: float, kv_tokens: float, attn_work: float) -> float:
        c = self.coef
        t = (c.a_ms + c.b_ms * new_tokens + c.c_ms * seqs + c.d_ms * kv_tokens + c.e_ms * attn_work) / 1e3
        if self.jitter:
            t *= 1.0 + self.jitter * max(-3.0, min(3.0, self._rng.gauss(0.0, 1.0)))
        return max(t, 1e-6)


def fit_linear(samples: Sequence[tuple[int, int, int, float]]) -> LinearCoefficients:
    """Least-squares fit of (new_tokens, seqs, kv_tokens, step_ms) samples (normal equations)."""
    rows = [(1.0, float(n), float(b), float(k)) for n, b, k, _ in samples]
    ys = [float(s[3]) for s in samples]
    if len(rows) < 4:
        raise UsageError(f"fitting a linear step model needs at least 4 samples, got {len(rows)}")
    m = 4
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(m)] for i in range(m)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(m)]
    for i in range(m):  # ridge term keeps collinear columns (e.g. constant batch) solvable
        ata[i][i] += 1e-9 * (ata[i][i] or 1.0)
    x = solve(ata, aty)
    return LinearCoefficients(a_ms=x[0], b_ms=x[1], c_ms=x[2], d_ms=x[3])


SAMPLE_COLUMNS = ("new_tokens", "seqs", "kv_tokens", "step_ms")


def read_step_samples(path: str, flag: str = "--linear-fit") -> list[tuple[int, int, int, float]]:
    """Measured steps from a CSV with the columns new_tokens,seqs,kv_tokens,step_ms (header required)."""
    import csv

    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise UsageError(f"cannot read {flag} {path}: {exc.strerror}") from None
    if not rows or any(c not in rows[0] for c in SAMPLE_COLUMNS):
        raise UsageError(f"{flag} {path}: expected a CSV header with {','.join(SAMPLE_COLUMNS)}")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            out.append((int(row["new_tokens"]), int(row["seqs"]), int(row["kv_tokens"]), float(row["step_ms"])))
        except (TypeError, ValueError):
            raise UsageError(f"{flag} {path} line {line}: expected integers and step_ms in ms, "
                             f"got {[row.get(c) for c in SAMPLE_COLUMNS]}") from None
    return out


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    aug = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(aug[r][col]))
        aug[col], aug[piv] = aug[piv], aug[col]
        if abs(aug[col][col]) < 1e-300:
            continue
        for r in range(n):
            if r != col:
                f = aug[r][col] / aug[col][col]
                aug[r] = [x - f * y for x, y in zip(aug[r], aug[col], strict=True)]
    return [aug[i][n] / aug[i][i] if aug[i][i] else 0.0 for i in range(n)]
