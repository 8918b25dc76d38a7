"""The simulator's hardware and model catalog: GPUs, model shapes, weight precisions.

Pure data plus lookup (names are case-insensitive) and TOML loading of custom entries. Figures
are published datasheet numbers (DESIGN §6); this module never computes timings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    experts: int = 0  # MoE: routed experts per layer (0 = dense)
    experts_per_token: int = 0  # MoE: routed experts each token uses (top-k)

    @property
    def active_b(self) -> float:
        return self.active_params_b if self.active_params_b is not None else self.params_b

    def weights_read_b(self, tokens: float) -> float:
        """Parameters (billions) a step over `tokens` tokens streams from memory. Dense: all of them.
        MoE: the shared part plus each routed expert at least one token picked, counted for uniform
        top-k routing: E·(1 − (1 − k/E)^tokens) experts per layer (one token reads the active
        parameters; a few dozen read nearly all). Real routers are skewed, so this is an upper bound."""
        e, k = self.experts, self.experts_per_token
        if not (e and k and self.active_params_b is not None) or tokens >= 64 * e:
            return self.params_b
        per_expert = (self.params_b - self.active_params_b) / (e - k)
        shared = self.active_params_b - k * per_expert
        return shared + e * per_expert * (1.0 - (1.0 - k / e) ** max(tokens, 1.0))


class Precision(msgspec.Struct, frozen=True, kw_only=True):
    """What a weight format changes in a step, as explicit factors over bf16.

    Decode is memory-bound: its gain is `weight_bytes` (bytes streamed per weight, scales included).
    Prefill is compute-bound: its gain is `gemm_speedup` on GPUs with native tensor cores for the
    format (`native`: "fp8" = Ada/Hopper, "int8" = any tensor-core GPU), else `emulated_speedup`
    (the weights are dequantised to 16-bit inside the GEMM; the math stays bf16).
    """

    weight_bytes: float
    gemm_speedup: float = 1.0
    emulated_speedup: float = 1.0
    native: str = ""  # "" = 16-bit math, always available


# Sources of the factors:
# - fp8 (W8A8): vLLM FP8 docs (docs.vllm.ai/en/stable/features/quantization/fp8/): "2x reduction in model
#   memory requirements and up to a 1.6x improvement in throughput"; on Ampere it runs as weight-only W8A16
#   (FP8 Marlin), so the math stays 16-bit there.
# - int8 (W8A8, SmoothQuant): Xiao et al., ICML 2023 (arXiv 2211.10438): "up to 1.56x speedup and 2x memory
#   reduction".
# - int4 / awq (W4A16): Lin et al., AWQ, MLSys 2024 (arXiv 2306.00978), group size 128 with an fp16 scale
#   and zero per group: 0.5 + 4/128 bytes per weight; Frantar et al., MARLIN, PPoPP 2025 (arXiv
#   2408.11743): "close to maximum (4x) quantization speedup" for batches up to 16-32 (memory-bound
#   decode: the bytes ratio), "gradually decreasing" at 64-128, i.e. no gain once compute-bound (prefill).
PRECISIONS: dict[str, Precision] = {
    "bf16": Precision(weight_bytes=2.0),
    "fp16": Precision(weight_bytes=2.0),
    "fp8": Precision(weight_bytes=1.0, gemm_speedup=1.6, native="fp8"),
    "int8": Precision(weight_bytes=1.0, gemm_speedup=1.56, native="int8"),
    "int4": Precision(weight_bytes=0.5 + 4 / 128),
    "awq": Precision(weight_bytes=0.5 + 4 / 128),
}

# An all-reduce of B bytes among tp GPUs costs link_latency_us + 2(tp−1)/tp × B / link_gb_s (steptime.py).
# A100: the least-squares line through Vidur's NCCL profile of a DGX A100 node (TP 2 and 4, 27 log-spaced
#   sizes of 2 KiB–64 MiB each; tests/bench/ground_truth/vidur_a100_llama2_7b/all_reduce.csv, MIT):
#   42 µs + 175 GB/s (test_profile_vidur.py recomputes it). LLM-Inference-Bench's vLLM rows on two and four
#   A100s agree: with the datasheet's 300 GB/s and 8 µs the sim was 7–24 % fast there.
# H100/H200: 8 µs and 450 GB/s (NVLink 4's 900 GB/s bidirectional, halved). vLLM's CI latency anchor for
#   70B on four H100s (V1, its custom all-reduce) rules out NCCL's line there (Vidur's DGX H100 profile,
#   ~28 µs: +18 % on the anchor).
_NVLINK_A100: dict[str, Any] = {"link_gb_s": 175.0, "link_latency_us": 42.0}
_NVLINK_H100: dict[str, Any] = {"link_gb_s": 450.0, "link_latency_us": 8.0}

# GPU sources (HBM TB/s, dense bf16 TFLOP/s without sparsity, memory): NVIDIA datasheets
#   A100-80G  nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
#   H100-SXM  nvidia.com/en-us/data-center/h100/  (3.35 TB/s, 989 TF bf16 dense = 1,979 with sparsity / 2)
#   A100-40G  same datasheet (SXM4 40 GB: 1,555 GB/s, 312 TF bf16; ALCF Polaris's GPU)
#   H200      nvidia.com/en-us/data-center/h200/  (4.8 TB/s, 141 GB)
#   GH200     nvidia.com/en-us/data-center/grace-hopper-superchip/ (H100 GPU with 96 GB HBM3 at 4 TB/s)
#   L40S      nvidia.com/en-us/data-center/l40s/ ; A10 nvidia.com/en-us/data-center/products/a10-gpu/ ;
#   L4        nvidia.com/en-us/data-center/l4/
#   RTX-4090  NVIDIA Ada GPU architecture whitepaper (FP16/BF16 tensor, FP16 accumulate) ;
#   RTX-3090  NVIDIA Ampere GA102 whitepaper (same convention)
# NVLink: see _NVLINK_A100 / _NVLINK_H100 above. MFU: fitted
# (steptime.py: A100 on DistServe's OPT-13B profile, H100/H200 on vLLM's CI latency test).
GPUS: dict[str, Gpu] = {
    g.name.lower(): g
    for g in (
        Gpu(name="A100-80G", hbm_tb_s=2.039, bf16_tflops=312, memory_gib=80, mfu=0.65, **_NVLINK_A100),
        Gpu(name="A100-40G", hbm_tb_s=1.555, bf16_tflops=312, memory_gib=40, mfu=0.65, **_NVLINK_A100),
        Gpu(name="H100-SXM", hbm_tb_s=3.35, bf16_tflops=989, memory_gib=80, mfu=0.45, fp8=True, **_NVLINK_H100),
        Gpu(name="H200", hbm_tb_s=4.8, bf16_tflops=989, memory_gib=141, mfu=0.45, fp8=True, **_NVLINK_H100),
        Gpu(name="GH200", hbm_tb_s=4.0, bf16_tflops=989, memory_gib=96, mfu=0.45, fp8=True, **_NVLINK_H100),
        Gpu(name="L40S", hbm_tb_s=0.864, bf16_tflops=362, memory_gib=48, mfu=0.32, fp8=True),
        Gpu(name="A10", hbm_tb_s=0.6, bf16_tflops=125, memory_gib=24, mfu=0.35),
        Gpu(name="L4", hbm_tb_s=0.3, bf16_tflops=121, memory_gib=24, mfu=0.35, fp8=True),
        Gpu(name="RTX-4090", hbm_tb_s=1.008, bf16_tflops=165, memory_gib=24, mfu=0.35, fp8=True),
        Gpu(name="RTX-3090", hbm_tb_s=0.936, bf16_tflops=71, memory_gib=24, mfu=0.35),
    )
}

# Model sources: each model's config.json on Hugging Face (layers = num_hidden_layers, hidden, heads,
# kv_heads = num_key_value_heads, vocab, max_context = max_position_embeddings), parameters from its card:
#   llama-3-8b / -70b  huggingface.co/meta-llama/Meta-Llama-3-8B (-70B)/blob/main/config.json
#   qwen2.5-7b         huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
#   mixtral-8x7b       huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json (46.7 B total,
#                      12.9 B active: mistral.ai/news/mixtral-of-experts; 8 local experts, 2 per token)
#   opt-13b            huggingface.co/facebook/opt-13b/blob/main/config.json
#   llama-2-7b         huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json (6.74 B, multi-head KV)
#   mistral-7b         huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json (7.24 B)
MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model(name="llama-3-8b", params_b=8.03, layers=32, hidden=4096, heads=32, kv_heads=8,
              head_dim=128, vocab=128256, max_context=8192),
        Model(name="llama-3-70b", params_b=70.6, layers=80, hidden=8192, heads=64, kv_heads=8,
              head_dim=128, vocab=128256, max_context=8192),
        Model(name="qwen2.5-7b", params_b=7.62, layers=28, hidden=3584, heads=28, kv_heads=4,
              head_dim=128, vocab=152064, max_context=32768),
        Model(name="mixtral-8x7b", params_b=46.7, active_params_b=12.9, experts=8, experts_per_token=2,
              layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=32000, max_context=32768),
        Model(name="llama-2-7b", params_b=6.74, layers=32, hidden=4096, heads=32, kv_heads=32,
              head_dim=128, vocab=32000, max_context=4096),
        Model(name="mistral-7b", params_b=7.24, layers=32, hidden=4096, heads=32, kv_heads=8,
              head_dim=128, vocab=32000, max_context=32768),
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


def precision(name: str) -> Precision:
    """The factors of a weight precision name (see PRECISIONS for their sources)."""
    key = name.strip().lower()
    if key not in PRECISIONS:
        raise UsageError(f"unknown dtype {name!r}; choose one of: {', '.join(PRECISIONS)}")
    return PRECISIONS[key]


def gemm_speedup(p: Precision, gpu: Gpu) -> float:
    """Prefill GEMM speed-up of `p` on `gpu`: native tensor cores, else dequantised 16-bit math."""
    native = p.native == "int8" or (p.native == "fp8" and gpu.fp8) or not p.native
    return p.gemm_speedup if native else p.emulated_speedup


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
        Model(name="qwen3-30b-a3b", params_b=30.5, active_params_b=3.3, experts=128, experts_per_token=8,
              layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, vocab=151936, max_context=40960),
        # huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (128 experts, 8 active; 22B active)
        Model(name="qwen3-235b-a22b", params_b=235.1, active_params_b=22.2, experts=128, experts_per_token=8,
              layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, vocab=151936, max_context=40960),
        # huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: MLA caches one compressed latent per
        # layer and token, kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values, written here as
        # kv_heads=1 × head_dim=288 × 2 (K and V) so the KV bytes per token are exact (replicated per TP
        # rank, as vLLM does); 671B total, 37B active; max_position_embeddings 163840
        Model(name="deepseek-v3", params_b=671.0, active_params_b=37.0, experts=256, experts_per_token=8,
              layers=61, hidden=7168, heads=128, kv_heads=1, head_dim=288, vocab=129280, max_context=163840),
        # huggingface.co/openai/gpt-oss-20b/blob/main/config.json (32 experts, 4 active; 3.6B active; MXFP4
        # experts: use dtype=int4 for their weight bytes). Half the layers use a 128-token sliding window;
        # counted here as full attention (an upper bound on KV)
        Model(name="gpt-oss-20b", params_b=20.9, active_params_b=3.6, experts=32, experts_per_token=4,
              layers=24, hidden=2880, heads=64, kv_heads=8, head_dim=64, vocab=201088, max_context=131072),
        # huggingface.co/openai/gpt-oss-120b/blob/main/config.json (128 experts, 4 active; 5.1B active)
        Model(name="gpt-oss-120b", params_b=116.8, active_params_b=5.1, experts=128, experts_per_token=4,
              layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, vocab=201088, max_context=131072),
    )
})
