"""`--timing profile DIR`: step times summed from Vidur's per-operator GPU profiles (`mlp.csv`, `attention.csv`).

A Vidur profile times each operation of one transformer layer by token count (mlp.csv) and attention by
batch and context (attention.csv); with tensor parallelism, its network profile (`all_reduce.csv`) times
the all-reduce by message size. One step = the embedding + layers × (the layer's operations at the step's
token count + its attention + two all-reduces of the step's activations), each interpolated linearly
between the profiled points. Reads only those CSVs, once per process (the tables are shared, never
changed after parsing); the layer count comes from the catalog model.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from slogate.replay.sim.catalog import Model
from slogate.traces.usage import UsageError

MLP_FILE, ATTENTION_FILE = "mlp.csv", "attention.csv"
NETWORK_FILE = "all_reduce.csv"  # from Vidur's data/profiling/network/<node>/, needed for --tp > 1
ACTIVATION_BYTES = 2  # an fp16 activation: the all-reduce of a step moves tokens × hidden × 2 bytes
# the operations of one layer in mlp.csv (timed by num_tokens): norms, QKV and output projections, rotary
# embedding, the gated MLP and the residual add; `emb` (the token embedding) runs once per step
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
STEP_OPS = ("emb",)
ATTN_OPS = ("attn_input_reshape", "attn_output_reshape")  # around the kernel (attn_decode or attn_prefill)
STAT = "median"  # Vidur writes min/max/mean/median/std of each operation; the median is the robust one


def is_vidur_dir(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and (p / MLP_FILE).is_file() and (p / ATTENTION_FILE).is_file()


def _between(xs: list[float], x: float, y0: float, y1: float, i: int) -> float:
    """The value at x on the line through (xs[i-1], y0) and (xs[i], y1)."""
    return y0 + (x - xs[i - 1]) * (y1 - y0) / (xs[i] - xs[i - 1])


def _interval(xs: list[float], x: float) -> int:
    """i such that x lies in [xs[i-1], xs[i]], or beyond the first or last interval (at least two xs)."""
    return min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)


class Line:
    """y(x) linear between points, extended past either end along its last interval."""

    def __init__(self, points: dict[float, list[float]]) -> None:
        self.x = sorted(points)
        self.y = [sum(points[x]) / len(points[x]) for x in self.x]  # a repeated x: the mean of its values

    def at(self, x: float) -> float:
        xs, ys = self.x, self.y
        if len(xs) == 1:
            return ys[0]
        i = _interval(xs, x)
        return _between(xs, x, ys[i - 1], ys[i], i)


class Surface:
    """z(x, y) from rows of points that need not share their y values (Vidur's prefill grid is a
    triangle, chunk + context ≤ max_model_len): along y within the two x rows around x, then along x."""

    def __init__(self, points: dict[float, dict[float, list[float]]]) -> None:
        self.x = sorted(points)
        self.rows = [Line(points[x]) for x in self.x]

    def at(self, x: float, y: float) -> float:
        xs = self.x
        if len(xs) == 1:
            return self.rows[0].at(y)
        i = _interval(xs, x)
        return _between(xs, x, self.rows[i - 1].at(y), self.rows[i].at(y), i)


def _read(path: Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise UsageError(f"cannot read --timing profile {path}: {exc.strerror}") from None
    missing = [c for c in needed if not rows or c not in rows[0]]
    if missing:
        raise UsageError(f"--timing profile {path}: not Vidur's layout, no column(s) {', '.join(missing)}")
    return rows


def _ms(row: dict[str, str], op: str, path: Path) -> float:
    """An operation's time (ms) in a row; empty (not run in this row) is 0."""
    key = f"time_stats.{op}.{STAT}"
    v = row.get(key) or ""
    try:
        ms = float(v) if v else 0.0
    except ValueError:
        ms = -1.0
    if not 0.0 <= ms < math.inf:
        raise UsageError(f"--timing profile {path}: bad {key} {v!r} (a time in ms, or empty)")
    return ms


def _num(row: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(float(row[key]))
    except (TypeError, ValueError):
        raise UsageError(f"--timing profile {path}: bad {key} {row.get(key)!r}") from None


def _check_model(have: dict[str, int], model: Model, directory: str) -> None:
    want = {"n_embd": model.hidden, "n_head": model.heads, "n_kv_head": model.kv_heads}
    if any(v != want[k] for k, v in have.items()):
        raise UsageError(f"--timing profile {directory}: profiled for {', '.join(f'{k} {v}' for k, v in have.items())}, "
                         f"but --model {model.name} has {', '.join(f'{k} {want[k]}' for k in have)}; "
                         f"pass the profiled model's --model")


def _all_reduce(path: Path, tp: int) -> Line:
    """The all-reduce among `tp` GPUs of one node (ms) by message bytes, from Vidur's network profile."""
    if not path.is_file():
        raise UsageError(f"--timing profile {path.parent}: --tp {tp} needs the all-reduce times of your node: copy "
                         f"Vidur's data/profiling/network/<node>/{NETWORK_FILE} there")
    rows = _read(path, ("num_workers", "devices_per_node", "size", "collective", f"time_stats.all_reduce.{STAT}"))
    points: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        if (r["collective"] == "all_reduce" and _num(r, "num_workers", path) == tp
                and _num(r, "devices_per_node", path) == tp):  # one node: NVLink among the tp GPUs
            points[_num(r, "size", path)].append(_ms(r, "all_reduce", path))
    if not points:
        raise UsageError(f"--timing profile {path}: no all-reduce among {tp} GPUs of one node")
    return Line(points)


class Tables(NamedTuple):
    """A profile parsed at one TP degree: what VidurSteps interpolates, and the profiled model's shape."""
    shape: dict[str, int]  # n_embd, n_head, n_kv_head as profiled (those the CSV has)
    layer_ops: Line  # one layer's operations by token count (ms)
    step_ops: Line  # the embedding by token count (ms)
    decode: Surface  # one layer's decode attention by (batch, context)
    prefill: Surface  # one layer's prompt-chunk attention by (tokens, context)
    all_reduce: Line | None  # ms by message bytes, with tp > 1


def _stamp(d: Path) -> tuple[tuple[int, int] | None, ...]:
    """The profile's files as they are now (a file rewritten since is read again)."""
    out: list[tuple[int, int] | None] = []
    for name in (MLP_FILE, ATTENTION_FILE, NETWORK_FILE):
        try:
            st = (d / name).stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def tables(directory: str, tp: int) -> Tables:
    """The profile at `tp`, parsed once per process: the start-up check and every replica share it."""
    d = Path(directory).resolve()
    return _parse(d, tp, _stamp(d))


@functools.lru_cache(maxsize=8)
def _parse(d: Path, tp: int, stamp: tuple[tuple[int, int] | None, ...]) -> Tables:
    layer_ops, step_ops, decode, prefill, shape = _compute_tables(d, tp)
    all_reduce = _all_reduce(d / NETWORK_FILE, tp) if tp > 1 else None
    return Tables(shape, layer_ops, step_ops, decode, prefill, all_reduce)


def _compute_tables(d: Path, tp: int) -> tuple[Line, Line, Surface, Surface, dict[str, int]]:
    """mlp.csv and attention.csv at `tp`: one layer's operations and the embedding by token count (ms), one
    layer's attention for decodes (batch, context) and prompt chunks (tokens, context), and the profiled
    model's shape (n_embd, n_head, n_kv_head: those mlp.csv has)."""
    mlp_path, attn_path = d / MLP_FILE, d / ATTENTION_FILE
    stats = tuple(f"time_stats.{op}.{STAT}" for op in (*LAYER_OPS, *STEP_OPS))
    mlp = _read(mlp_path, ("num_tokens", "num_tensor_parallel_workers", *stats))
    attn = _read(attn_path, ("batch_size", "kv_cache_size", "prefill_chunk_size", "is_prefill",
                             "num_tensor_parallel_workers"))
    degrees = sorted({_num(r, "num_tensor_parallel_workers", mlp_path) for r in mlp}
                     & {_num(r, "num_tensor_parallel_workers", attn_path) for r in attn})
    if tp not in degrees:
        raise UsageError(f"--timing profile {d}: no rows for --tp {tp} in both tables (profiled: {degrees}); "
                         f"pass one of those")
    mlp = [r for r in mlp if _num(r, "num_tensor_parallel_workers", mlp_path) == tp]
    attn = [r for r in attn if _num(r, "num_tensor_parallel_workers", attn_path) == tp]
    layer: dict[float, list[float]] = defaultdict(list)
    step: dict[float, list[float]] = defaultdict(list)
    for r in mlp:
        n = _num(r, "num_tokens", mlp_path)
        layer[n].append(sum(_ms(r, op, mlp_path) for op in LAYER_OPS))
        step[n].append(sum(_ms(r, op, mlp_path) for op in STEP_OPS))
    decode: dict[float, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    prefill: dict[float, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in attn:
        k = _num(r, "kv_cache_size", attn_path)
        around = sum(_ms(r, op, attn_path) for op in ATTN_OPS)
        if r["is_prefill"].strip().lower() == "true":  # b chunks of n tokens, each after k of context
            n = _num(r, "prefill_chunk_size", attn_path) * _num(r, "batch_size", attn_path)
            prefill[n][k].append(_ms(r, "attn_prefill", attn_path) + around)
        else:  # b sequences, each at context k
            decode[_num(r, "batch_size", attn_path)][k].append(_ms(r, "attn_decode", attn_path) + around)
    if not decode or not prefill:
        raise UsageError(f"--timing profile {attn_path}: needs both decode and prefill rows")
    shape: dict[str, int] = {k: _num(mlp[0], k, mlp_path) for k in ("n_embd", "n_head", "n_kv_head") if k in mlp[0]}
    return Line(layer), Line(step), Surface(decode), Surface(prefill), shape


class VidurSteps:
    """A step model from a Vidur profile. The engine prices each step with its sequences (`of_batch`). From
    a step's totals alone (`step(new_tokens, seqs, kv_tokens, attn_work)`, as the engine's runs of plain decode
    steps call it) the shape is split into attention calls: sequences that all add one token are a decode
    batch at their mean context; with `v0` (prompt steps run only prompts) the prompts are one chunk of the
    same attention work, n(c + n/2); otherwise one prompt chunk beside seqs − 1 decodes, its context solved
    from the step's KV tokens and attention work. With `tp` > 1 the tables' rows for that degree, and the
    all-reduce of DIR/all_reduce.csv."""

    def __init__(self, directory: str, model: Model, *, tp: int = 1, v0: bool = False, jitter: float = 0.0,
                 seed: int = 0) -> None:
        t = tables(directory, tp)
        _check_model(t.shape, model, directory)
        self.layer_ops, self.step_ops, self.decode, self.prefill = t.layer_ops, t.step_ops, t.decode, t.prefill
        self.all_reduce = t.all_reduce  # ms by message bytes; two per layer
        self.hidden = model.hidden
        self.layers = model.layers
        self.v0 = v0
        self.jitter = jitter
        self._rng = random.Random(seed)

    def attention_ms(self, new_tokens: float, seqs: float, kv_tokens: float, attn_work: float) -> float:
        """One layer's attention calls for the step (ms)."""
        if new_tokens <= seqs:  # every sequence adds one token: a decode batch at the mean context
            return self.decode.at(seqs, kv_tokens / seqs - 1)
        if self.v0 or seqs <= 1:  # prompts only: one chunk (or an equivalent one of the same work)
            if seqs <= 1:
                return self.prefill.at(new_tokens, max(kv_tokens - new_tokens, 0.0))
            return self.prefill.at(math.sqrt(2 * attn_work), 0.0)
        d = seqs - 1  # one prompt chunk of n beside d decodes: c_p from W − K (decodes add c + ½ and c + 1)
        n = new_tokens - d
        c = max((attn_work - kv_tokens + 0.5 * d - n * n / 2 + n) / (n - 1), 0.0) if n > 1 else 0.0
        kv_decode = max(kv_tokens - c - n, d)
        return self.prefill.at(n, c) + self.decode.at(d, kv_decode / d - 1)

    def batch_attention_ms(self, batch: Sequence[Any], batch_tokens: Sequence[int]) -> float:
        """One layer's attention calls for a step's sequences (`num_computed` tokens of context each, adding
        `batch_tokens`): the decodes as one batch at their mean context, the prompt chunks as one call (a
        single chunk at its context; several as one chunk of their summed attention work, n(c + n/2) each)."""
        decodes = context = 0
        chunks: list[tuple[int, int]] = []
        for req, n in zip(batch, batch_tokens, strict=True):
            if n == 1:
                decodes += 1
                context += req.num_computed
            else:
                chunks.append((n, req.num_computed))
        ms = self.decode.at(decodes, context / decodes) if decodes else 0.0
        if len(chunks) == 1:
            ms += self.prefill.at(*chunks[0])
        elif chunks:
            ms += self.prefill.at(math.sqrt(2 * sum(n * (c + n / 2) for n, c in chunks)), 0.0)
        return ms

    def step_ms(self, new_tokens: float, seqs: float, kv_tokens: float, attn_work: float) -> float:
        return self._total_ms(new_tokens, self.attention_ms(new_tokens, seqs, kv_tokens, attn_work))

    def _total_ms(self, new_tokens: float, attention_ms: float) -> float:
        per_layer = self.layer_ops.at(new_tokens) + attention_ms
        if self.all_reduce is not None:  # after the attention's output projection and after the MLP
            per_layer += 2 * self.all_reduce.at(new_tokens * self.hidden * ACTIVATION_BYTES)
        return self.step_ops.at(new_tokens) + self.layers * per_layer

    def _seconds(self, ms: float) -> float:
        t = max(ms, 1e-3) / 1e3
        if self.jitter:
            t *= 1.0 + self.jitter * max(-3.0, min(3.0, self._rng.gauss(0.0, 1.0)))
        return t

    def __call__(self, new_tokens: float, seqs: float, kv_tokens: float, attn_work: float) -> float:
        return self._seconds(self.step_ms(new_tokens, seqs, kv_tokens, attn_work))

    def of_batch(self, new_tokens: int, batch: Sequence[Any], batch_tokens: Sequence[int]) -> float:
        """The engine's step with its sequences (seconds): each one's attention call is known, where the
        totals of __call__ leave a step with several prompt chunks to estimate."""
        return self._seconds(self._total_ms(new_tokens, self.batch_attention_ms(batch, batch_tokens)))
