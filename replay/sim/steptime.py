"""How long one engine step takes: the roofline model of DESIGN §6 and a fitted linear model.

A step model is a pure function of the step's shape (new tokens, sequences, KV tokens read,
attention work) plus seeded jitter. It never looks at requests, clocks or the network.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from slogate.replay.sim.catalog import Gpu, Model, precision
from slogate.traces.usage import UsageError

# published fits (DESIGN §6)
HBM_EFF_WEIGHTS = 0.73
HBM_EFF_KV = 0.51
STEP_OVERHEAD_S = 0.13e-3
LAYER_OVERHEAD_S = 32e-6
SEQ_OVERHEAD_S = 4.4e-6


class StepShape(msgspec.Struct):
    """What one step computes: the inputs of every step model."""

    new_tokens: int  # prompt chunk tokens + one per decoding sequence
    seqs: int  # sequences in the batch (B)
    kv_tokens: int  # sum over sequences of (context + new tokens): KV bytes read
    attn_work: float  # sum over sequences of n * (c + n/2): attention FLOP term


class Roofline:
    """T_step = 0.13 ms + 32 µs·L + 4.4 µs·B + max(T_mem, T_comp) + T_comm(TP), times jitter."""

    def __init__(self, gpu: Gpu, model: Model, *, tp: int = 1, dtype: str = "bf16",
                 kv_bytes: float = 2.0, jitter: float = 0.02, seed: int = 0) -> None:
        if tp < 1:
            raise UsageError(f"--tp must be at least 1, got {tp}")
        b_w, speedup = precision(dtype)
        if dtype.lower() == "fp8" and not gpu.fp8:
            speedup = 1.0  # weight-only fp8 on cards without fp8 tensor cores
        bw = gpu.hbm_tb_s * 1e12
        flops = gpu.bf16_tflops * 1e12 * gpu.mfu * tp
        kv_heads = max(model.kv_heads, tp)  # heads are replicated when TP exceeds them
        kv_tok = 2 * model.layers * kv_heads * model.head_dim * kv_bytes
        self.t_weights = model.params_b * 1e9 * b_w / tp / (bw * HBM_EFF_WEIGHTS)
        self.kv_coef = kv_tok / tp / (bw * HBM_EFF_KV)
        self.lin_coef = 2 * model.active_b * 1e9 / (flops * speedup)
        self.attn_coef = 4 * model.layers * model.heads * model.head_dim / flops
        self.t_fixed = STEP_OVERHEAD_S + LAYER_OVERHEAD_S * model.layers
        if tp > 1:  # two all-reduces per layer: fixed latency + ring traffic of the activations
            self.comm_fixed = 2 * model.layers * gpu.link_latency_us * 1e-6
            self.comm_coef = 2 * model.layers * 2 * (tp - 1) / tp * model.hidden * 2 / (gpu.link_gb_s * 1e9)
        else:
            self.comm_fixed = self.comm_coef = 0.0
        self.jitter = jitter
        self._rng = random.Random(seed)

    def __call__(self, new_tokens: int, seqs: int, kv_tokens: int, attn_work: float) -> float:
        t_mem = self.t_weights + kv_tokens * self.kv_coef
        t_comp = new_tokens * self.lin_coef + attn_work * self.attn_coef
        t = self.t_fixed + SEQ_OVERHEAD_S * seqs + (t_mem if t_mem > t_comp else t_comp)
        if self.comm_fixed:
            t += self.comm_fixed + self.comm_coef * new_tokens
        if self.jitter:
            t *= 1.0 + self.jitter * max(-3.0, min(3.0, self._rng.gauss(0.0, 1.0)))
        return t


class LinearCoefficients(msgspec.Struct, frozen=True):
    """T_step (ms) = a + b·new_tokens + c·seqs + d·kv_tokens."""

    a_ms: float
    b_ms: float = 0.0
    c_ms: float = 0.0
    d_ms: float = 0.0


class Linear:
    """A linear step model with given or least-squares-fitted coefficients."""

    def __init__(self, coef: LinearCoefficients, *, jitter: float = 0.0, seed: int = 0) -> None:
        self.coef = coef
        self.jitter = jitter
        self._rng = random.Random(seed)

    def __call__(self, new_tokens: int, seqs: int, kv_tokens: int, attn_work: float) -> float:
        c = self.coef
        t = (c.a_ms + c.b_ms * new_tokens + c.c_ms * seqs + c.d_ms * kv_tokens) / 1e3
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
    x = _solve(ata, aty)
    return LinearCoefficients(a_ms=x[0], b_ms=x[1], c_ms=x[2], d_ms=x[3])


SAMPLE_COLUMNS = ("new_tokens", "seqs", "kv_tokens", "step_ms")


def read_step_samples(path: str) -> list[tuple[int, int, int, float]]:
    """Measured steps from a CSV with the columns new_tokens,seqs,kv_tokens,step_ms (header required)."""
    import csv

    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise UsageError(f"cannot read --linear-fit {path}: {exc.strerror}") from None
    if not rows or any(c not in rows[0] for c in SAMPLE_COLUMNS):
        raise UsageError(f"--linear-fit {path}: expected a CSV header with {','.join(SAMPLE_COLUMNS)}")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            out.append((int(row["new_tokens"]), int(row["seqs"]), int(row["kv_tokens"]), float(row["step_ms"])))
        except (TypeError, ValueError):
            raise UsageError(f"--linear-fit {path} line {line}: expected integers and step_ms in ms, "
                             f"got {[row.get(c) for c in SAMPLE_COLUMNS]}") from None
    return out


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
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
