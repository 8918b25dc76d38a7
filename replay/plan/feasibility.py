"""Does a candidate fit: weights + activation reserve + KV for the trace's context p99 in GPU memory.

The same memory arithmetic the simulator uses to size its KV cache (sim.kvcache.kv_blocks_for),
read back as a feasibility table row: how many sequences of that context can be resident at once,
or why none can. Pure: never simulates.
"""

from __future__ import annotations

import msgspec

from slogate.replay.plan.candidates import Candidate
from slogate.replay.sim import catalog
from slogate.replay.sim.kvcache import ACTIVATION_RESERVE_GIB, BLOCK_SIZE, kv_blocks_for
from slogate.traces.usage import UsageError

DEFAULT_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (sim.config.SimConfig)


class Fit(msgspec.Struct, kw_only=True):
    """One row of the feasibility table (memory per GPU, GiB)."""

    fits: bool
    reason: str | None = None
    weights_gib: float = 0.0  # per GPU (weights / tp)
    reserve_gib: float = ACTIVATION_RESERVE_GIB
    usable_gib: float = 0.0  # memory × gpu_memory_utilization
    kv_gib: float = 0.0  # what is left for the KV cache
    kv_blocks: int = 0
    context_tokens: int = 0  # the trace's (prompt + output) p99
    max_resident_seqs: int = 0  # sequences of that context the KV cache holds at once


def check(cand: Candidate, context_tokens: int) -> Fit:
    """The candidate's feasibility for sequences of `context_tokens` (prompt + output) tokens."""
    opts = cand.options
    gpu = catalog.find_gpu(cand.gpu)
    model = catalog.find_model(cand.model)
    tp = cand.int_option("tp", 1)
    dtype = opts.get("dtype", "bf16")
    kv_bytes = catalog.precision(opts.get("kv_dtype", "bf16")).weight_bytes
    try:
        util = float(opts.get("gpu_memory_utilization", DEFAULT_MEMORY_UTILIZATION))
    except ValueError:
        raise UsageError(f"bad candidate {cand.spec!r}: gpu_memory_utilization must be a fraction, e.g. 0.9") from None
    b_w = catalog.precision(dtype).weight_bytes
    weights = model.params_b * 1e9 * b_w / tp / catalog.GiB
    usable = gpu.memory_gib * util
    kv = usable - weights - ACTIVATION_RESERVE_GIB
    blocks = kv_blocks_for(gpu, model, tp=tp, dtype=dtype, kv_bytes=kv_bytes, gpu_memory_utilization=util)
    per_seq = -(-context_tokens // BLOCK_SIZE) if context_tokens > 0 else 1
    fit = Fit(fits=True, weights_gib=round(weights, 2), usable_gib=round(usable, 2), kv_gib=round(max(0.0, kv), 2),
              kv_blocks=blocks, context_tokens=context_tokens, max_resident_seqs=blocks // per_seq)
    max_len = int(opts.get("max_model_len", model.max_context))
    if kv <= 0:
        fit.fits = False
        fit.reason = (f"weights {weights:.1f} GiB/GPU ({dtype}, tp={tp}) + {ACTIVATION_RESERVE_GIB} GiB reserve exceed "
                      f"{usable:.1f} GiB usable ({gpu.memory_gib:g} GiB × {util:g}); raise tp or use a smaller dtype")
    elif blocks < 16:
        fit.fits = False
        fit.reason = (f"only {kv:.2f} GiB/GPU left for the KV cache after {weights:.1f} GiB of weights; "
                      f"raise tp or use a smaller dtype")
    elif fit.max_resident_seqs < 1:
        fit.fits = False
        fit.reason = (f"the KV cache ({blocks} blocks, {kv:.1f} GiB) cannot hold one sequence of the trace's "
                      f"context p99 ({context_tokens} tokens); raise tp or use kv_dtype=fp8")
    elif context_tokens > max_len:
        fit.fits = False
        fit.reason = f"the trace's context p99 ({context_tokens} tokens) exceeds {model.name}'s context ({max_len})"
    return fit
