"""`slogate sim` flags and TOML file → (SimConfig, ServerOptions, FaultConfig): argument handling only.

Shared by the `slogate sim` command and the replay's `sim:` targets; bad values raise UsageError
naming the value and the fix. Never starts a server or an event loop.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from slogate.replay.sim.catalog import GPUS, MODELS, PRECISIONS, Gpu, Model
from slogate.replay.sim.config import SimConfig
from slogate.replay.sim.faults import FaultConfig, parse_fault_config
from slogate.replay.sim.profile import check_profile_path
from slogate.replay.sim.server import ServerOptions
from slogate.replay.sim.steptime import LinearCoefficients, fit_linear, read_step_samples
from slogate.traces.usage import UsageError

EXAMPLES = """
examples:
  slogate sim --port 8000 --gpu h100-sxm --model llama-3-8b
  slogate sim --port 8000 --gpu a100-80g --model llama-3-70b --tp 4 --dtype fp8
  slogate sim --port 8000 --timing constant --ttft-ms 50 --itl-ms 10      # fixed timings
  slogate sim --port 8000 --linear-fit steps.csv       # step time fitted to measured engine steps
  slogate sim --port 8000 --timing profile steps.csv   # step times interpolated from a measured table
  slogate sim --port 8000 --model llama-2-7b --timing profile vidur/a100/meta-llama/Llama-2-7b-hf   # Vidur's profile
  slogate sim --port 8000 --replicas 4                                   # ports 8000-8003
  slogate sim --port 8000 --kv-blocks 200 --max-num-seqs 64              # force preemptions
  slogate sim --port 8000 --tp 4 --host-step-ms 6 --host-seq-us 60 --host-kv-ns 30   # host-bound steps (vLLM V0)
  slogate sim --port 8000 --fault error_rate=0.05 --fault dead=30:40 --fault slowdown=60:90:3
  slogate sim calibrate --target http://127.0.0.1:8000 --out gpu.toml   # fit to a real server
  slogate sim --port 8000 --config sim.toml                              # [sim] [server] [faults] [[gpu]] [[model]]
  curl -H 'x-slogate-fault: reset_after=5' ...                            # per-request fault

per-request fault header x-slogate-fault: error=500 | error_after=K | reset_after=K |
  stall_ms=MS,stall_after=K | hang | delay_ms=MS (comma-separated, combinable)
gpus: """ + ", ".join(g.name for g in GPUS.values()) + """
models: """ + ", ".join(MODELS) + """
dtypes: """ + ", ".join(PRECISIONS)


class SimFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A `--config` TOML file."""

    sim: dict[str, object] = {}
    server: dict[str, object] = {}
    faults: dict[str, object] = {}
    gpu: list[Gpu] = []
    model: list[Model] = []


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slogate sim", description="A simulated continuous-batching LLM engine "
                                "(vLLM V1 semantics, roofline step times) behind the OpenAI HTTP API.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--port", type=int, help="first port (replica i listens on port+i); default 8000")
    a("--host", help="bind address (default 127.0.0.1)")
    a("--gpu", help="GPU name (case-insensitive), default h100-sxm")
    a("--model", help="model name, default llama-3-8b")
    a("--served-model-name", help="model id clients must send (default: the model name)")
    a("--tp", type=int, help="tensor-parallel degree (1, 2, 4, 8)")
    a("--dtype", help="weight precision: " + ", ".join(PRECISIONS))
    a("--kv-dtype", help="KV-cache precision (default bf16; fp8 halves it)")
    a("--timing", nargs="+", metavar="MODEL", help="step-time model: roofline (default), constant, linear, "
      "or profile FILE|DIR (a measured CSV new_tokens,seqs,kv_tokens,step_ms, or a directory with Vidur's "
      "mlp.csv and attention.csv for --model; interpolated)")
    a("--ttft-ms", type=float, help="constant timing: time to first token")
    a("--itl-ms", type=float, help="constant timing: gap between tokens")
    a("--linear", help="linear timing coefficients A,B,C,D: step ms = A + B·tokens + C·seqs + D·kv_tokens")
    a("--linear-fit", metavar="CSV", help="linear timing fitted (least squares) to measured engine steps: a CSV "
      "with columns new_tokens,seqs,kv_tokens,step_ms")
    a("--max-num-seqs", type=int, help="max running requests (vLLM default by card)")
    a("--max-num-batched-tokens", type=int, help="token budget per step (vLLM default by card)")
    a("--max-model-len", type=int, help="context limit (default: the model's)")
    a("--kv-blocks", type=int, help="KV-cache blocks of 16 tokens (default: from memory)")
    a("--gpu-memory-utilization", type=float, help="fraction of GPU memory for weights+KV (default 0.9)")
    a("--scheduler", choices=["v1", "v0"], help="v1: chunked prefill (default); v0: prefill-first")
    a("--no-prefix-caching", action="store_true", help="disable automatic prefix caching")
    a("--jitter", type=float, help="relative step-time noise (default 0.02)")
    a("--host-step-ms", type=float, help="host work per step that overlaps the GPU (scheduling, inputs, outputs): "
      "a step lasts at least this plus --host-seq-us per sequence and --host-kv-ns per KV token (default 0: "
      "hidden; vLLM's V0 of 2024 showed about 6 ms + 60-100 µs + 30 ns)")
    a("--host-seq-us", type=float, help="host work per running sequence per step (default 0)")
    a("--host-kv-ns", type=float, help="host work per KV token of the batch per step: block tables (default 0)")
    a("--gpu-set", help="override/define GPU fields, e.g. hbm_tb_s=2.5,bf16_tflops=500,memory_gib=96")
    a("--model-set", help="override/define model fields, e.g. params_b=13,layers=40,hidden=5120")
    a("--replicas", type=int, help="number of engines, on consecutive ports")
    a("--seed", type=int, help="seed for jitter, output lengths and fault draws (default 0)")
    a("--max-waiting", type=int, help="bound on waiting requests; more are rejected")
    a("--reject-status", type=int, choices=[429, 503], help="status when the waiting queue is full")
    a("--enable-prompt-tokens-details", action="store_true", help="report usage.prompt_tokens_details")
    a("--fault", action="append", default=[], help="fault injection (repeatable), see below")
    a("--config", help="TOML file with [sim], [server], [faults], [[gpu]], [[model]]")
    return p


def _kv(spec: str, flag: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in spec.split(","):
        k, sep, v = part.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise UsageError(f"bad {flag} entry {part!r}; expected field=number") from None
        if not sep:
            raise UsageError(f"bad {flag} entry {part!r}; expected field=number")
    return out


def configure(argv: list[str]) -> tuple[SimConfig, ServerOptions, FaultConfig]:
    ns = parser().parse_args(argv)
    sim: dict[str, object] = {}
    server: dict[str, object] = {}
    faults_base = FaultConfig()
    if ns.config:
        try:
            f = msgspec.toml.decode(Path(ns.config).read_bytes(), type=SimFile)
            faults_base = msgspec.convert(f.faults, FaultConfig)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"cannot use --config {ns.config}: {exc}") from None
        sim.update(f.sim)
        server.update(f.server)
        if f.gpu or f.model:
            sim["catalog_file"] = ns.config
    if ns.timing:
        kind, *rest = ns.timing
        if kind not in ("roofline", "constant", "linear", "profile") or len(rest) != (kind == "profile"):
            raise UsageError(f"bad --timing {' '.join(ns.timing)!r}; use roofline, constant, linear or profile FILE|DIR")
        ns.timing = kind
        if rest:
            check_profile_path(rest[0])  # a bad table fails here, before any port is bound
            sim["profile"] = rest[0]
    for key in ("gpu", "model", "tp", "dtype", "kv_dtype", "timing", "ttft_ms", "itl_ms", "max_num_seqs",
                "max_num_batched_tokens", "max_model_len", "kv_blocks", "gpu_memory_utilization", "scheduler",
                "jitter", "host_step_ms", "host_seq_us", "host_kv_ns", "replicas", "seed"):
        if getattr(ns, key) is not None:
            sim[key] = getattr(ns, key)
    if ns.no_prefix_caching:
        sim["prefix_caching"] = False
    if ns.linear:
        try:
            a, b, c, d = (float(x) for x in ns.linear.split(","))
        except ValueError:
            raise UsageError(f"bad --linear {ns.linear!r}; expected four numbers A,B,C,D (ms)") from None
        sim["linear"] = LinearCoefficients(a, b, c, d)
        sim.setdefault("timing", "linear")
    if ns.linear_fit:
        if ns.linear:
            raise UsageError("give either --linear A,B,C,D or --linear-fit CSV, not both")
        sim["linear"] = fit_linear(read_step_samples(ns.linear_fit))
        sim.setdefault("timing", "linear")
    if (ns.linear or ns.linear_fit) and sim["timing"] != "linear":
        raise UsageError(f"--linear/--linear-fit set a linear step model but --timing is {sim['timing']}; "
                         "drop --timing or use --timing linear")
    if ns.gpu_set:
        sim["gpu_set"] = _kv(ns.gpu_set, "--gpu-set")
    if ns.model_set:
        sim["model_set"] = _kv(ns.model_set, "--model-set")
    if ns.timing == "constant" and ns.jitter is None:
        sim["jitter"] = 0.0
    for key in ("host", "port", "served_model_name", "max_waiting", "reject_status"):
        if getattr(ns, key) is not None:
            server[key] = getattr(ns, key)
    if ns.enable_prompt_tokens_details:
        server["enable_prompt_tokens_details"] = True
    try:
        config = msgspec.convert(sim, SimConfig)
        opts = msgspec.convert(server, ServerOptions)
    except msgspec.ValidationError as exc:
        raise UsageError(f"bad simulator setting: {exc}") from None
    faults = parse_fault_config(ns.fault, faults_base)
    if opts.port < 1 or opts.port + config.replicas - 1 > 65535:
        ports = (f"--port {opts.port}" if config.replicas == 1
                 else f"--port {opts.port} with {config.replicas} replicas (ports {opts.port}–{opts.port + config.replicas - 1})")
        raise UsageError(f"{ports} is outside 1–65535; pass a port in that range")
    return config, opts, faults
