"""`--timing profile FILE`: step times interpolated from a table someone measured on their GPU.

The table is a CSV `new_tokens,seqs,kv_tokens,step_ms` (the `--linear-fit` layout); a directory with
Vidur's per-operator profile is replay.sim.vidur's. Inside the
table's ranges a step time is the inverse-distance mean of the nearest measured rows (distance in
units of each column's range), so measured shapes come back exactly; outside, the table's
least-squares linear model plus the nearest rows' residuals extrapolates. Pure arithmetic: it never reads a file after startup.
"""

from __future__ import annotations

import random
from pathlib import Path

from slogate.replay.sim.catalog import Model
from slogate.replay.sim.steptime import fit_linear, read_step_samples
from slogate.replay.sim.vidur import ATTENTION_FILE, MLP_FILE, VidurSteps, is_vidur_dir
from slogate.traces.usage import UsageError

NEIGHBOURS = 4


class Profile:
    """A step model from measured (new_tokens, seqs, kv_tokens, step_ms) rows."""

    def __init__(self, rows: list[tuple[int, int, int, float]], *, jitter: float = 0.0, seed: int = 0) -> None:
        self.coef = c = fit_linear(rows)
        self.points = [(float(n), float(b), float(k)) for n, b, k, _ in rows]
        self.residuals = [ms - (c.a_ms + c.b_ms * n + c.c_ms * b + c.d_ms * k) for n, b, k, ms in rows]
        self.times = [ms for *_, ms in rows]
        self.lo = [min(p[i] for p in self.points) for i in range(3)]
        self.hi = [max(p[i] for p in self.points) for i in range(3)]
        self.scale = [max(1.0, h - lo) for h, lo in zip(self.hi, self.lo, strict=True)]
        self.jitter = jitter
        self._rng = random.Random(seed)

    def step_ms(self, new_tokens: int, seqs: int, kv_tokens: int) -> float:
        c = self.coef
        q = (new_tokens, seqs, kv_tokens)
        inside = all(self.lo[i] <= q[i] <= self.hi[i] for i in range(3))
        base = 0.0 if inside else c.a_ms + c.b_ms * new_tokens + c.c_ms * seqs + c.d_ms * kv_tokens
        values = self.times if inside else self.residuals
        dist = sorted((sum(((p[i] - q[i]) / self.scale[i]) ** 2 for i in range(3)), r)
                      for p, r in zip(self.points, values, strict=True))[:NEIGHBOURS]
        if dist[0][0] == 0.0:
            return base + dist[0][1]
        w = [1.0 / d for d, _ in dist]
        return base + sum(wi * r for wi, (_, r) in zip(w, dist, strict=True)) / sum(w)

    def __call__(self, new_tokens: int, seqs: int, kv_tokens: int, attn_work: float) -> float:
        t = max(self.step_ms(new_tokens, seqs, kv_tokens), 1e-3) / 1e3
        if self.jitter:
            t *= 1.0 + self.jitter * max(-3.0, min(3.0, self._rng.gauss(0.0, 1.0)))
        return t


def check_profile_path(path: str) -> None:
    """Refuse a bad table early (a Vidur directory is read, and checked against the model, when the engine is
    built: replay.sim.vidur)."""
    if Path(path).is_dir():
        if not is_vidur_dir(path):
            raise UsageError(f"--timing profile {path}: a directory needs Vidur's {MLP_FILE} and {ATTENTION_FILE}")
        return
    read_step_samples(path, "--timing profile")


def load_profile(path: str, model: Model, *, tp: int = 1, v0: bool = False, jitter: float = 0.0,
                 seed: int = 0) -> Profile | VidurSteps:
    """The step model of `--timing profile PATH`: a Vidur profile directory (priced for `model`) or a table."""
    if is_vidur_dir(path):
        return VidurSteps(path, model, tp=tp, v0=v0, jitter=jitter, seed=seed)
    return Profile(read_step_samples(path, "--timing profile"), jitter=jitter, seed=seed)
