"""Run the independent benchmark clients slogate is compared with (AIPerf, guidellm), offline, for the tests.

They live in their own venv (`make install-test` builds `.venv/peers`, so their pins never change
slogate's test environment) and load the GGUF's own tokenizer from a local Hugging Face cache
built here; `HF_HUB_OFFLINE=1` is set, so they never reach a hub. Never skips: a missing install is
a clear error naming the `make` step.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.traces.formats import guidellm_results
from tests.realservers import GEMMA_GGUF, MODEL_CACHE, MissingDependency, gemma_model_path
from tests.servers import REPO

PEERS_VENV = REPO / ".venv" / "peers"
TOKENIZER_REPO = "slogate-local/gemma3-270m"  # a name in the local cache only: nothing by it on any hub
_SNAPSHOT = "0" * 40


class PeerRequest(msgspec.Struct, frozen=True):
    """One request as the peer measured it (seconds; start is UNIX time)."""

    start: float
    ttft: float
    e2e: float  # the peer's own: AIPerf to the last content chunk, guidellm to the stream's close after [DONE]
    connect: float  # of the TTFT, time spent opening the connection (AIPerf's http_req_connecting; guidellm: 0,
    #                 its start is when the request headers are written, on an open connection)
    output_tokens: int
    input_tokens: int
    pre_send: float = 0.0  # of the TTFT, time before the request had left the client: AIPerf's http_req_sending
    #                        (aiohttp's request start → its last byte written: pool, connect, headers, body)


def peer_binary(name: str) -> Path:
    path = PEERS_VENV / "bin" / name
    if not path.exists():
        raise MissingDependency(f"{path} is missing: run `make install-test` (it builds .venv/peers with {name})")
    return path


def aiperf_binary() -> Path:
    return peer_binary("aiperf")


OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def gemma_hf_cache(root: Path = MODEL_CACHE / "hf-hub") -> Path:
    """A Hugging Face hub cache holding the GGUF's tokenizer as `TOKENIZER_REPO` (built once, offline).

    The tokenizer.json from tests/gateway/tokens_gguf.py gains the SentencePiece decoder (▁ → space,
    byte fallback), which AIPerf needs to turn token ids back into prompt text of the asked length."""
    from tokenizers import Tokenizer, decoders

    from tests.gateway.tokens_gguf import build_tokenizer_json

    repo_dir = root / f"models--{TOKENIZER_REPO.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / _SNAPSHOT
    if (snapshot / "tokenizer_config.json").exists():
        return root
    source = build_tokenizer_json(gemma_model_path(), MODEL_CACHE / GEMMA_GGUF.replace(".gguf", ".tokenizer.json"))
    tok = Tokenizer.from_file(str(source))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    snapshot.mkdir(parents=True, exist_ok=True)
    tok.save(str(snapshot / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
              "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 32768}
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(_SNAPSHOT)
    (snapshot / "tokenizer_config.json").write_text(json.dumps(config))  # last: marks the cache complete
    return root


def run_aiperf(
    url: str,
    out: Path,
    *,
    input_tokens: int,
    output_tokens: int,
    requests: int,
    concurrency: int = 1,
    warmup: int = 0,
    extra_body: dict | None = None,
    seed: int = 1,
    timeout: float = 300.0,
) -> list[PeerRequest]:
    """`aiperf profile` of streaming chats against `url`; its per-request records, in start order.
    AIPerf starts about ten processes, each importing transformers (~17 s of CPU per run on this box):
    `warmup` requests let that burst pass before the measured ones.

    llama-cpp-python's server reads `max_tokens`, not AIPerf's `max_completion_tokens`, so both go."""
    extra: list[str] = ["--extra-inputs", f"max_tokens:{output_tokens}"]
    if warmup:  # sent first and left out of the export, as the replay's --warmup
        extra += ["--warmup-request-count", str(warmup)]
    if extra_body:
        extra += ["--extra-inputs", json.dumps(extra_body)]
    cmd: Sequence[str] = [
        str(aiperf_binary()), "profile", "--model", "gemma", "--url", url,
        "--endpoint-type", "chat", "--streaming", "--tokenizer", TOKENIZER_REPO,
        "--synthetic-input-tokens-mean", str(input_tokens), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(output_tokens), "--output-tokens-stddev", "0", *extra,
        "--concurrency", str(concurrency), "--request-count", str(requests), "--random-seed", str(seed),
        "--workers-max", "1", "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
        "--output-artifact-dir", str(out),
    ]  # fmt: skip
    # its memory-mapped dataset goes under the run's folder (else /tmp/aiperf_mmap_*, left behind)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **OFFLINE, "HF_HUB_CACHE": str(gemma_hf_cache()), "AIPERF_DATASET_MMAP_BASE_PATH": str(out)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    export = out / "profile_export.jsonl"
    if done.returncode != 0 or not export.exists():
        raise AssertionError(f"aiperf exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    rows = [json.loads(line) for line in export.read_text().splitlines() if line.strip()]
    measured = [r for r in rows if r["metadata"].get("benchmark_phase", "profiling") == "profiling"]  # not warmup
    return sorted(map(_request, measured), key=lambda r: r.start)


def _request(row: dict) -> PeerRequest:
    m = row["metrics"]
    return PeerRequest(
        start=row["metadata"]["request_start_ns"] / 1e9,
        ttft=m["time_to_first_token"]["value"] / 1e3,
        e2e=m["request_latency"]["value"] / 1e3,
        connect=m.get("http_req_connecting", {}).get("value", 0.0) / 1e3,
        output_tokens=int(m["output_sequence_length"]["value"]),
        input_tokens=int(m["input_sequence_length"]["value"]),
        pre_send=m.get("http_req_sending", {}).get("value", 0.0) / 1e3,
    )


def gemma_tokenizer_dir() -> Path:
    """The local tokenizer directory (the cache's snapshot): guidellm's transformers loads a hub id
    only with a model config.json beside it, a directory without one."""
    root = gemma_hf_cache()
    return root / f"models--{TOKENIZER_REPO.replace('/', '--')}" / "snapshots" / _SNAPSHOT


def run_guidellm(
    url: str,
    out: Path,
    *,
    input_tokens: int,
    output_tokens: int,
    requests: int,
    concurrency: int = 1,
    extra_body: dict | None = None,
    seed: int = 1,
    model: str = "gemma",
    timeout: float = 300.0,
) -> list[PeerRequest]:
    """`guidellm run` of streaming chats against `url` (a scenario file: the CLI's kind=… options take
    no nested JSON); its per-request stats from `benchmarks.json`, in start order. `sample_size` 0:
    guidellm keeps no prompt or output text in the report.

    llama-cpp-python's server reads `max_tokens`, not guidellm's `max_completion_tokens`, so both go."""
    out.mkdir(parents=True, exist_ok=True)
    body = {"max_tokens": output_tokens, **(extra_body or {})}
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model, "extras": {"body": body},
                    "validate_backend": False},  # it would GET /health, which llama-cpp-python has not
        "tokenizer": {"kind": "huggingface_auto", "model": str(gemma_tokenizer_dir())},
        "profile": {"kind": "concurrent", "streams": [concurrency]} if concurrency > 1 else {"kind": "synchronous"},
        "constraints": [{"kind": "max_requests", "count": requests}],
        "data": [{"kind": "synthetic_text", "prompt_tokens": input_tokens, "output_tokens": output_tokens}],
        "seed": {"kind": "static", "value": seed},
        "metrics": {"kind": "generative", "sample_size": 0},
        "outputs": [{"kind": "json", "path": str(out / "benchmarks.json")}],
    }}  # fmt: skip
    (out / "scenario.json").write_text(json.dumps(scenario))
    cmd = [str(peer_binary("guidellm")), "run", "--scenario", str(out / "scenario.json"), "--disable-console-interactive"]
    done = subprocess.run(cmd, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=out)
    report = out / "benchmarks.json"
    if done.returncode != 0 or not report.exists():
        raise AssertionError(f"guidellm exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return read_guidellm(report)


def read_guidellm(report: Path) -> list[PeerRequest]:
    """The requests of a one-benchmark guidellm report, read by slogate's own reader, in start order."""
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    # guidellm fails a request whose streamed text is only whitespace (Gemma with its end tokens banned
    # sometimes writes 16 newlines), though its timings are complete: those are measured requests here.
    failed = [r["info"].get("error") for r in benchmark["requests"]["errored"] + benchmark["requests"]["incomplete"]]
    assert all("UNUSABLE_BACKEND_RESPONSE" in str(e) for e in failed), (benchmark["metrics"]["request_totals"], failed)
    t0 = min(r["info"]["timings"]["request_start"] for r in benchmark["requests"]["successful"] + benchmark["requests"]["errored"])
    return [PeerRequest(start=t0 + r.t, ttft=r.ttft, e2e=r.e2e, connect=0.0, output_tokens=r.output_tokens,
                        input_tokens=r.input_tokens or 0)  # type: ignore[arg-type]
            for r in guidellm_results.read_records(benchmark)]
