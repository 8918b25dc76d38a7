"""The simulator's hardware and model catalog: GPUs, model shapes, weight precisions.

Pure data plus lookup (names are case-insensitive) and TOML loading of custom entries. Figures
are published datasheet numbers (DESIGN §6); this module never computes timings.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from slogate.traces.usage import UsageError

GiB = 1 << 30


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    """One accelerator: HBM bandwidth, dense bf16 throughput, memory, achievable MFU, interconnect."""

    name: str
    hbm_tb_s: float  # HBM bandwidth, TB/s
    bf16_tflops: float  # dense bf16 tensor throughput, TFLOP/s
    memory_gib: float
    mfu: float = 0.35  # model FLOPs utilisation reached by real kernels
    fp8: bool = False  # hardware fp8 tensor cores (Ada, Hopper)
    link_gb_s: float = 32.0  # per-GPU all-reduce bandwidth (NVLink or PCIe), GB/s
    link_latency_us: float = 15.0  # per all-reduce fixed cost


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """One transformer: parameter count (total and active per token), shape, context."""

    name: str
    params_b: float  # total parameters, billions (weights in memory)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_context: int
    active_params_b: float | None = None  # MoE: parameters touched per token; None = dense

    @property
    def active_b(self) -> float:
        return self.active_params_b if self.active_params_b is not None else self.params_b


# bytes per weight and the compute speed-up over bf16 when the GPU supports the format
PRECISIONS: dict[str, tuple[float, float]] = {
    "bf16": (2.0, 1.0),
    "fp16": (2.0, 1.0),
    "fp8": (1.0, 2.0),
    "int8": (1.0, 2.0),
    "int4": (0.5, 1.0),  # weight-only: memory halves again, math stays 16-bit
}

_NVLINK_A100 = {"link_gb_s": 300.0, "link_latency_us": 8.0}
_NVLINK_H100 = {"link_gb_s": 450.0, "link_latency_us": 8.0}

GPUS: dict[str, Gpu] = {
    g.name.lower(): g
    for g in (
        Gpu(name="A100-80G", hbm_tb_s=2.039, bf16_tflops=312, memory_gib=80, mfu=0.65, **_NVLINK_A100),
        Gpu(name="H100-SXM", hbm_tb_s=3.35, bf16_tflops=989, memory_gib=80, mfu=0.45, fp8=True, **_NVLINK_H100),
        Gpu(name="H200", hbm_tb_s=4.8, bf16_tflops=989, memory_gib=141, mfu=0.45, fp8=True, **_NVLINK_H100),
        Gpu(name="L40S", hbm_tb_s=0.864, bf16_tflops=362, memory_gib=48, mfu=0.32, fp8=True),
        Gpu(name="A10", hbm_tb_s=0.6, bf16_tflops=125, memory_gib=24, mfu=0.35),
        Gpu(name="L4", hbm_tb_s=0.3, bf16_tflops=121, memory_gib=24, mfu=0.35, fp8=True),
        Gpu(name="RTX-4090", hbm_tb_s=1.008, bf16_tflops=165, memory_gib=24, mfu=0.35, fp8=True),
        Gpu(name="RTX-3090", hbm_tb_s=0.936, bf16_tflops=71, memory_gib=24, mfu=0.35),
    )
}

MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model(name="llama-3-8b", params_b=8.03, layers=32, hidden=4096, heads=32, kv_heads=8,
              head_dim=128, vocab=128256, max_context=8192),
        Model(name="llama-3-70b", params_b=70.6, layers=80, hidden=8192, heads=64, kv_heads=8,
              head_dim=128, vocab=128256, max_context=8192),
        Model(name="qwen2.5-7b", params_b=7.62, layers=28, hidden=3584, heads=28, kv_heads=4,
              head_dim=128, vocab=152064, max_context=32768),
        Model(name="mixtral-8x7b", params_b=46.7, active_params_b=12.9, layers=32, hidden=4096, heads=32,
              kv_heads=8, head_dim=128, vocab=32000, max_context=32768),
        Model(name="opt-13b", params_b=12.9, layers=40, hidden=5120, heads=40, kv_heads=40,
              head_dim=128, vocab=50272, max_context=2048),
    )
}

_ALIASES = {"h100": "h100-sxm", "a100": "a100-80g", "4090": "rtx-4090", "3090": "rtx-3090"}


class CustomCatalog(msgspec.Struct, kw_only=True):
    """A TOML file's `[[gpu]]` and `[[model]]` tables, added to (or overriding) the built-in catalog."""

    gpu: list[Gpu] = []
    model: list[Model] = []


def _choices(table: dict) -> str:
    return ", ".join(v.name for v in table.values())


def find_gpu(name: str, extra: dict[str, Gpu] | None = None) -> Gpu:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    table = {**GPUS, **(extra or {})}
    if key not in table:
        raise UsageError(f"unknown GPU {name!r}; choose one of: {_choices(table)} (or define [[gpu]] in --config)")
    return table[key]


def find_model(name: str, extra: dict[str, Model] | None = None) -> Model:
    key = name.strip().lower()
    table = {**MODELS, **(extra or {})}
    if key not in table:
        raise UsageError(
            f"unknown model {name!r}; choose one of: {_choices(table)} (or define [[model]] in --config)"
        )
    return table[key]


def precision(name: str) -> tuple[float, float]:
    """(bytes per weight, compute speed-up) of a weight precision name."""
    key = name.strip().lower()
    if key not in PRECISIONS:
        raise UsageError(f"unknown dtype {name!r}; choose one of: {', '.join(PRECISIONS)}")
    return PRECISIONS[key]


def load_custom(path: str | Path) -> tuple[dict[str, Gpu], dict[str, Model]]:
    """GPUs and models defined in a TOML file (`[[gpu]]` / `[[model]]` arrays of tables)."""
    try:
        data = msgspec.toml.decode(Path(path).read_bytes(), type=CustomCatalog)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"cannot read catalog entries from {path}: {exc}") from None
    return {g.name.lower(): g for g in data.gpu}, {m.name.lower(): m for m in data.model}


# Long-context and current models (appended; shapes from each model's published config.json, so KV
# bytes per token = 2 × layers × kv_heads × head_dim × dtype bytes come out as the engines allocate them).
MODELS.update({
    m.name: m
    for m in (
        # huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json (max_position_embeddings 131072)
        Model(name="llama-3.1-8b", params_b=8.03, layers=32, hidden=4096, heads=32, kv_heads=8,
              head_dim=128, vocab=128256, max_context=131072),
        # huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
        Model(name="llama-3.1-70b", params_b=70.6, layers=80, hidden=8192, heads=64, kv_heads=8,
              head_dim=128, vocab=128256, max_context=131072),
        # huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json (126 layers, 8 KV heads)
        Model(name="llama-3.1-405b", params_b=405.9, layers=126, hidden=16384, heads=128, kv_heads=8,
              head_dim=128, vocab=128256, max_context=131072),
        # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (128 experts, 8 active; 3.3B active;
        # max_position_embeddings 40960 without YaRN)
        Model(name="qwen3-30b-a3b", params_b=30.5, active_params_b=3.3, layers=48, hidden=2048, heads=32,
              kv_heads=4, head_dim=128, vocab=151936, max_context=40960),
        # huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (128 experts, 8 active; 22B active)
        Model(name="qwen3-235b-a22b", params_b=235.1, active_params_b=22.2, layers=94, hidden=4096, heads=64,
              kv_heads=4, head_dim=128, vocab=151936, max_context=40960),
        # huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: MLA caches one compressed latent per
        # layer and token, kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values, written here as
        # kv_heads=1 × head_dim=288 × 2 (K and V) so the KV bytes per token are exact (replicated per TP
        # rank, as vLLM does); 671B total, 37B active; max_position_embeddings 163840
        Model(name="deepseek-v3", params_b=671.0, active_params_b=37.0, layers=61, hidden=7168, heads=128,
              kv_heads=1, head_dim=288, vocab=129280, max_context=163840),
        # huggingface.co/openai/gpt-oss-20b/blob/main/config.json (32 experts, 4 active; 3.6B active; MXFP4
        # experts: use dtype=int4 for their weight bytes). Half the layers use a 128-token sliding window;
        # counted here as full attention (an upper bound on KV)
        Model(name="gpt-oss-20b", params_b=20.9, active_params_b=3.6, layers=24, hidden=2880, heads=64,
              kv_heads=8, head_dim=64, vocab=201088, max_context=131072),
        # huggingface.co/openai/gpt-oss-120b/blob/main/config.json (128 experts, 4 active; 5.1B active)
        Model(name="gpt-oss-120b", params_b=116.8, active_params_b=5.1, layers=36, hidden=2880, heads=64,
              kv_heads=8, head_dim=64, vocab=201088, max_context=131072),
    )
})
