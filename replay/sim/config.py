"""Simulator configuration: one `SimConfig` struct (flags, TOML `[sim]`) resolved into engine parts.

`build(config)` turns names into catalog entries, a step model, KV block count and vLLM's
default limits. Validation errors name the bad value and the fix; nothing here touches time or I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Literal

import msgspec

from slogate.replay.sim import catalog
from slogate.replay.sim.kvcache import kv_blocks_for
from slogate.replay.sim.profile import load_profile
from slogate.replay.sim.steptime import Linear, LinearCoefficients, Roofline
from slogate.traces.usage import UsageError

StepFn = Callable[[int, int, int, float], float]


class SimConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything that decides simulated timing. Defaults are vLLM's where vLLM has one."""

    gpu: str = "h100-sxm"
    model: str = "llama-3-8b"
    tp: int = 1
    dtype: str = "bf16"  # weight precision: bf16 fp16 fp8 int8 int4
    kv_dtype: str = "bf16"  # KV cache stays 16-bit unless set (fp8 halves it)
    timing: Literal["roofline", "constant", "linear", "profile"] = "roofline"
    ttft_ms: float = 50.0  # constant model
    itl_ms: float = 10.0  # constant model
    linear: LinearCoefficients | None = None  # linear model (ms); see steptime.fit_linear
    profile: str | None = None  # profile model: CSV new_tokens,seqs,kv_tokens,step_ms (replay/sim/profile.py)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_blocks: int | None = None  # overrides memory-derived block count
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    scheduler: Literal["v1", "v0"] = "v1"
    prefix_caching: bool = True
    jitter: float = 0.02  # relative std-dev of step time
    # The engine's host work per step (scheduling, inputs and block tables, output processing) that runs
    # alongside the GPU: a step lasts at least host_step_ms + host_seq_us × sequences + host_kv_ns × KV
    # tokens in the batch. All 0 = always hidden.
    host_step_ms: float = 0.0
    host_seq_us: float = 0.0
    host_kv_ns: float = 0.0
    seed: int = 0
    replicas: int = 1
    hash_block_tokens: int = 16  # tokens per trace hash id (SimRequest.hash_ids)
    output_median_tokens: int = 200  # seeded length distribution when a request forces none
    catalog_file: str | None = None  # TOML with extra [[gpu]] / [[model]] tables
    gpu_set: dict[str, float] = {}  # field overrides of the GPU (or all fields of a new one)
    model_set: dict[str, float] = {}  # field overrides of the model (or all fields of a new one)


class EngineSpec(msgspec.Struct, kw_only=True):
    """A config resolved against the catalog: what one replica's engine is built from."""

    config: SimConfig
    gpu: catalog.Gpu
    model: catalog.Model
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int

    @property
    def served_model(self) -> str:
        return self.model.name


def vllm_defaults(gpu: catalog.Gpu) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): 8192/1024 on ≥70 GiB non-A100 cards, else 2048/256."""
    if gpu.memory_gib >= 70 and not gpu.name.lower().startswith("a100"):
        return 8192, 1024
    return 2048, 256


def build(config: SimConfig) -> EngineSpec:
    gpus, models = catalog.load_custom(config.catalog_file) if config.catalog_file else ({}, {})
    gpu = _resolve(catalog.Gpu, config.gpu, config.gpu_set, gpus, catalog.find_gpu)
    model = _resolve(catalog.Model, config.model, config.model_set, models, catalog.find_model)
    catalog.precision(config.dtype)
    kv_bytes = catalog.precision(config.kv_dtype).weight_bytes
    if config.tp < 1 or config.tp & (config.tp - 1):
        raise UsageError(f"--tp {config.tp} is not supported; use 1, 2, 4 or 8")
    if not 0.05 <= config.gpu_memory_utilization <= 1.0:
        raise UsageError(f"--gpu-memory-utilization {config.gpu_memory_utilization} must be in (0.05, 1]")
    blocks = config.kv_blocks
    if blocks is None:
        blocks = kv_blocks_for(gpu, model, tp=config.tp, dtype=config.dtype, kv_bytes=kv_bytes,
                               gpu_memory_utilization=config.gpu_memory_utilization)
        if blocks < 16:
            raise UsageError(
                f"{model.name} ({config.dtype}) does not fit on {config.tp}× {gpu.name} with room for a KV "
                f"cache; raise --tp, use a smaller --dtype, or set --kv-blocks"
            )
    elif blocks < 1:
        raise UsageError(f"--kv-blocks must be at least 1, got {blocks}")
    d_tokens, d_seqs = vllm_defaults(gpu)
    seqs = config.max_num_seqs or d_seqs
    tokens = config.max_num_batched_tokens or d_tokens
    if seqs < 1 or tokens < 1:
        raise UsageError("--max-num-seqs and --max-num-batched-tokens must be positive")
    max_len = config.max_model_len or model.max_context
    if config.scheduler == "v0":
        tokens = max(tokens, max_len)  # V0 cannot chunk a prompt
    for name in ("ttft_ms", "itl_ms"):
        if getattr(config, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be ≥ 0, got {getattr(config, name)}")
    if config.timing == "linear" and config.linear is None:
        raise UsageError("--timing linear needs coefficients: --linear A,B,C,D (ms) or [sim.linear] in --config")
    if config.timing == "profile":
        if not config.profile:
            raise UsageError("--timing profile needs a table: --timing profile steps.csv (new_tokens,seqs,kv_tokens,step_ms) "
                             "or a directory with Vidur's mlp.csv and attention.csv")
        load_profile(config.profile, model, tp=config.tp)  # a bad table fails here, before any port is bound
    if config.replicas < 1:
        raise UsageError(f"--replicas must be at least 1, got {config.replicas}")
    return EngineSpec(config=config, gpu=gpu, model=model, kv_blocks=blocks, max_num_seqs=seqs,
                      max_num_batched_tokens=tokens, max_model_len=max_len)


def _resolve(cls, name, overrides, extra, find):  # type: ignore[no-untyped-def]
    """A catalog entry with field overrides, or a new entry defined entirely by overrides."""
    fields = set(cls.__struct_fields__) - {"name"}
    bad = set(overrides) - fields
    if bad:
        raise UsageError(f"unknown {cls.__name__.lower()} field(s) {sorted(bad)}; use: {', '.join(sorted(fields))}")
    ints = {f for f in fields if cls.__annotations__.get(f) in ("int", int)}
    vals = {k: int(v) if k in ints else v for k, v in overrides.items()}
    try:
        base = find(name, extra)
    except UsageError:
        if not vals:
            raise
        try:
            return cls(name=name, **vals)
        except TypeError:
            raise UsageError(f"unknown {cls.__name__.lower()} {name!r}; pick a catalog name or give all of: "
                             f"{', '.join(sorted(fields))}") from None
    return msgspec.structs.replace(base, **vals) if vals else base


def step_model(spec: EngineSpec, seed: int) -> StepFn:
    """The step-time function of a roofline or linear config (constant timing has none)."""
    c = spec.config
    if c.timing == "linear":
        assert c.linear is not None
        return Linear(c.linear, jitter=c.jitter, seed=seed)
    if c.timing == "profile":
        assert c.profile is not None
        return load_profile(c.profile, spec.model, tp=c.tp, v0=c.scheduler == "v0", jitter=c.jitter, seed=seed)
    kv_bytes = catalog.precision(c.kv_dtype).weight_bytes
    return Roofline(spec.gpu, spec.model, tp=c.tp, dtype=c.dtype, kv_bytes=kv_bytes, jitter=c.jitter, seed=seed,
                    scheduler=c.scheduler, host_step_s=c.host_step_ms / 1e3, host_seq_s=c.host_seq_us / 1e6,
                    host_kv_s=c.host_kv_ns / 1e9)


def output_length(rng: random.Random, median: int, cap: int) -> int:
    """Seeded output length: log-normal around the median (σ = 0.8), clipped to [1, cap]."""
    n = int(math.exp(rng.gauss(math.log(max(1, median)), 0.8)))
    return max(1, min(cap, n))
