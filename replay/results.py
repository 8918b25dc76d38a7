"""The result of one replay run: the `results.json` schema (versioned), read and written here.

The summary inside it is `traces.summary.RunSummary`, computed by `traces.summary.summarize` (the one
summary every surface uses). No computation here, and no I/O except `load`/`dump`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

from slogate.replay.sessions import SessionsSummary
from slogate.traces.summary import RunSummary

RESULTS_SCHEMA_VERSION = 2  # 2: one summary (traces.summary), offered-window throughput, drain, drift counts
_S = TypeVar("_S", bound=msgspec.Struct)


class Environment(msgspec.Struct, omit_defaults=True):
    """Where and how the run happened (never an API key)."""

    target: str = ""
    models: list[str] = []  # from the target's /v1/models
    server_version: str | None = None  # from /version when offered
    labels: dict[str, str] = {}  # --label gpu=H100 --label framework=vllm-0.11
    trace: str | None = None  # trace file name
    trace_digest: str | None = None  # sha256 of the trace file(s)
    seed: int | None = None
    command: list[str] = []
    slogate_version: str = ""
    start_unix: float = 0.0
    endpoint: str = "/v1/chat/completions"
    stream: bool = True
    output_forcing: str | None = None  # "ignore_eos", "min_tokens", "logit_bias", "none"
    tokenizer: str | None = None  # "server:/tokenize", "file:…", "calibrated"
    prompt_base_tokens: int | None = None  # tokens the target adds around any prompt (chat template)
    slo: dict[str, str] = {}  # name -> spec
    shard: str | None = None  # "i/N" for a distributed replay shard
    # added by the replay engine (additive):
    server_kind: str | None = None  # vllm, sglang, llamacpp, slogate-sim, unknown
    clock: str = "real"  # "real" (HTTP, wall clock) or "virtual" (simulator API, no HTTP)
    workload: list[str] = []  # source then transforms, e.g. ["trace:x.csv", "window=0:600", "speed=10"]
    request_timeout_s: float | None = None
    retries: int | None = None  # retries before any response byte (connect error, 429/502/503)
    workers: int | None = None  # sending processes
    shards: list[str] = []  # merged runs: the shard specs combined
    # what the server (or, failing that, --label) says about the hardware and engine (additive):
    gpu: str | None = None  # accelerator model
    gpu_count: int | None = None  # GPUs serving one replica (TP × PP)
    gpu_memory: str | None = None  # per GPU, e.g. "80 GiB"
    driver: str | None = None
    cuda: str | None = None
    framework: str | None = None  # vllm, sglang, llama.cpp, slogate-sim
    framework_version: str | None = None
    precision: str | None = None  # weight dtype
    engine: dict[str, str] = {}  # engine flags: max_num_seqs, max_num_batched_tokens, tp, prefix_caching, …
    recorded_by: dict[str, str] = {}  # field -> where its value came from ("server /props", "label", …)
    prompt_tokens: str | None = None  # length convention: "server" (prompt_tokens incl. template) | "content"
    prompt_lengths_checked: str | None = None  # "8 of 8 exact on server:/tokenize": sampled prompts counted before the run
    # --prompt-tokens content: tokens the target adds to every prompt (BOS, chat template), measured; input drift
    # compares the plan plus these with the server's prompt_tokens (None: not measured, no input drift)
    prompt_added_tokens: int | None = None
    warmup_traffic: dict[str, int] = {}  # requests sent before the run, by kind: tokenize, calibration_chat, …


class Results(msgspec.Struct, omit_defaults=False):
    """`results.json`."""

    schema_version: int = RESULTS_SCHEMA_VERSION
    environment: Environment = msgspec.field(default_factory=Environment)
    summary: RunSummary = msgspec.field(default_factory=RunSummary)
    point: dict[str, float] = {}  # sweep point (speed / rate / concurrency) when part of a sweep
    sessions: SessionsSummary | None = None  # session-timed replays (replay.sessions.summarize)
    prefix_cache_hit_rate: float | None = None  # prompt tokens served from the prefix cache (exact: --virtual)


def write_json(obj: msgspec.Struct, path: str | Path) -> None:
    """Indented JSON of a struct (results.json, sweep.json)."""
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(obj), indent=2) + b"\n")


def read_json(path: str | Path, type_: type[_S], name: str) -> _S:
    """Read a struct from a JSON file, or from the file `name` inside a directory."""
    p = Path(path)
    if p.is_dir():
        p = p / name
    return msgspec.json.decode(p.read_bytes(), type=type_)


def dump(results: Results, path: str | Path) -> None:
    write_json(results, path)


class _Written(msgspec.Struct):
    """What every results.json that slogate wrote holds (all of Results' fields have defaults, so
    without this check any JSON object, e.g. `{}` or a plan.json, would read as a run of 0 requests)."""

    class Summary(msgspec.Struct):
        requests: int

    schema_version: int
    summary: Summary


def load(path: str | Path) -> Results:
    """Read a results.json (a directory holding one is accepted too). A file that is not one (no
    schema_version or summary.requests) or of a newer schema is a msgspec.ValidationError."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    data = p.read_bytes()
    written = msgspec.json.decode(data, type=_Written)
    if written.schema_version > RESULTS_SCHEMA_VERSION:
        raise msgspec.ValidationError(f"schema_version {written.schema_version} is newer than this slogate reads "
                                      f"({RESULTS_SCHEMA_VERSION}): upgrade slogate")
    return msgspec.json.decode(data, type=Results)
