"""The target of a replay: an HTTP URL, or `sim:GPU/MODEL[?opts]` (a simulated engine we start).

Parses `--target`, starts the sim in a child process on a free port when asked, and probes the
server (`/v1/models`, `/version`, llama.cpp `/props`, vLLM `*_info` metrics, server kind) for the
results' environment. Never sends load.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp
import msgspec

from slogate.replay.child_process import free_port, group_options, stop_group
from slogate.traces.usage import UsageError

if TYPE_CHECKING:
    from slogate.replay.sim.config import SimConfig
    from slogate.replay.sim.faults import FaultConfig


class TargetSpec(msgspec.Struct):
    spec: str
    url: str | None = None  # HTTP base URL (None for a sim not started yet)
    sim: dict[str, str] | None = None  # sim options: gpu, model, and query options


class Probe(msgspec.Struct):
    models: list[str] = []
    server_version: str | None = None
    kind: str = "unknown"  # vllm, sglang, llamacpp, slogate-sim, unknown
    env: dict[str, str] = {}  # Environment field (or "engine.FLAG") -> value, as the server states it
    env_source: dict[str, str] = {}  # the same keys -> which endpoint said it


ENV_FIELDS = ("gpu", "gpu_count", "gpu_memory", "driver", "cuda", "framework", "framework_version", "precision")
# vLLM `*_info` gauge labels worth keeping as engine flags (the rest are noise for a reader)
_VLLM_FLAGS = {"block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks",
               "max_num_seqs", "max_num_batched_tokens", "max_model_len", "tensor_parallel_size", "dtype",
               "pipeline_parallel_size", "quantization", "kv_cache_dtype", "enable_chunked_prefill"}


def parse_target(spec: str) -> TargetSpec:
    """`http://host:port[/v1]` or `sim:GPU/MODEL?tp=4&dtype=fp8&timing=constant&ttft_ms=1`."""
    if spec.startswith("sim:"):
        body = spec[4:]
        path, _, query = body.partition("?")
        gpu, _, model = path.partition("/")
        opts = {k: v for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)}
        if gpu:
            opts["gpu"] = gpu
        if model:
            opts["model"] = model
        return TargetSpec(spec=spec, sim=opts)
    parsed = urllib.parse.urlparse(spec)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"bad --target {spec!r}: expected http://HOST:PORT or sim:GPU/MODEL[?opts]")
    url = spec.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    return TargetSpec(spec=spec, url=url)


def with_repeat_seed(spec: str, k: int) -> str:
    """Repeat `k` (1-based) of a `sim:` target: its seed + k - 1, so each repeat draws its own jitter,
    output lengths and faults (repeats of one seed would hide the sim's own variance). Other targets
    are returned unchanged."""
    if not spec.startswith("sim:") or k == 1:
        return spec
    head, _, query = spec.partition("?")
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    seed = next((int(v) for key, v in pairs if key == "seed" and v.lstrip("-").isdigit()), 0)
    pairs = [(key, v) for key, v in pairs if key != "seed"] + [("seed", str(seed + k - 1))]
    return f"{head}?{urllib.parse.urlencode(pairs)}"


def sim_args(opts: dict[str, str]) -> list[str]:
    """`slogate sim` command-line flags for `sim:` options (tp=4 → --tp 4, flag with no value → --flag)."""
    args: list[str] = []
    for key, value in opts.items():
        flag = f"--{key.replace('_', '-')}"
        args += [flag, value] if value != "" else [flag]
    return args


class SimOptionError(UsageError):
    """A `sim:` option `slogate sim`'s own flag parser refused; the message is its reason alone."""


def configured(opts: dict[str, str]) -> tuple[SimConfig, FaultConfig]:
    """(engine config, faults) of `sim:` options, parsed exactly as `slogate sim` parses its flags. A bad
    one raises `SimOptionError` with argparse's reason, without its usage text."""
    from slogate.replay.sim.options import configure

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            config, _, faults = configure(sim_args(opts))
    except SystemExit:
        raise SimOptionError((said.getvalue().strip().splitlines() or [""])[-1]
                             .removeprefix("slogate sim: error: ")) from None
    return config, faults


def sim_config(opts: dict[str, str], *, virtual: bool = False):
    """The engine config for `sim:` options, parsed exactly as `slogate sim` parses them. `virtual`: for a
    virtual-time run, which has no HTTP request for a fault to act on: faults are refused, not ignored."""
    from slogate.replay.sim.faults import FaultConfig

    try:
        config, faults = configured(opts)
    except SimOptionError as exc:
        raise UsageError(f"bad sim option in --target: {str(exc) or sorted(opts)} (see slogate sim --help)") from None
    if virtual and faults != FaultConfig():
        raise UsageError("sim faults act on HTTP requests, which a --virtual run does not send: drop --virtual "
                         "(the sim then runs on the real clock) or the fault options")
    return config


@contextlib.asynccontextmanager
async def start_sim(opts: dict[str, str], *, timeout: float = 30.0) -> AsyncIterator[str]:
    """Run `slogate sim` in a child process on a free port; yields its URL; always stops it.

    Waits on the event loop without blocking it, so a Ctrl-C while the sim starts is handled at once.
    """
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())", "sim", "--port", str(port),
           *sim_args(opts)]
    log = tempfile.NamedTemporaryFile(prefix="slogate-sim-", suffix=".log", delete=False)  # noqa: SIM115
    # its own process group: a terminal's Ctrl-C reaches the replay alone, which drains the requests in
    # flight (the sim must keep serving them) and then stops the sim here
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            **group_options())  # type: ignore[call-overload]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                with open(log.name, errors="replace") as fh:
                    tail = fh.read().strip().splitlines()[-1:] or ["(no output)"]
                raise UsageError(f"the simulated target {' '.join(cmd[3:])!r} exited: {tail[0]}")
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.2)
            except OSError:  # refused, or TimeoutError (an OSError) while the sim starts
                if time.monotonic() > deadline:
                    raise UsageError(f"the simulated target did not start within {timeout:g}s") from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            break
        yield url
    finally:
        stop_group(proc, 10.0)  # at teardown: the run is over, a short blocking wait is fine
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


def _reach_error(url: str, exc: BaseException) -> UsageError:
    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        if isinstance(err, ConnectionRefusedError) or getattr(err, "errno", None) == 111:
            reason = "connection refused"
        else:
            reason = (getattr(err, "strerror", None) or str(err) or str(exc)).lower()
    elif isinstance(exc, asyncio.TimeoutError):
        reason = "timed out"
    else:
        reason = str(exc) or type(exc).__name__
    return UsageError(f"cannot reach {url}: {reason}; is the server running?")


async def probe(session: aiohttp.ClientSession, url: str, headers: dict[str, str], *, wait_s: float = 0.0) -> Probe:
    """GET /v1/models (required) and /version (optional); `wait_s` retries while the port warms up."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            async with session.get(url + "/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                status = resp.status
                models_body = await resp.json(content_type=None) if status == 200 else None
                server_header = resp.headers.get("Server", "")
            break
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            if time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                continue
            raise _reach_error(url, exc) from None
    if status in (401, 403):
        raise UsageError(f"{url}/v1/models answered {status}: pass --api-key or --header Authorization:…")
    out = Probe()
    owners: set[str] = set()
    if isinstance(models_body, dict) and isinstance(models_body.get("data"), list):
        for m in models_body["data"]:
            if isinstance(m, dict) and isinstance(m.get("id"), str):
                out.models.append(m["id"])
                owners.add(str(m.get("owned_by", "")).lower())
    version_body: object = None
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        async with session.get(url + "/version", headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                version_body = await resp.json(content_type=None)
    if isinstance(version_body, dict):
        v = version_body.get("version")
        out.server_version = str(v) if v is not None else msgspec.json.encode(version_body).decode()
    out.kind = _kind(owners, version_body, server_header)
    if out.server_version and out.kind in ("vllm", "sglang", "slogate-sim"):
        _put(out, "framework", "vllm" if out.kind == "vllm" else out.kind, "/version")
        _put(out, "framework_version", out.server_version, "/version")
    if out.kind in ("llamacpp", "unknown"):
        props = await _get_json(session, url + "/props", headers)
        if isinstance(props, dict):
            out.kind = "llamacpp"
            _llamacpp_props(out, props)
    if out.kind in ("vllm", "unknown", "slogate-sim"):
        text = await _get_text(session, url + "/metrics", headers)
        if text:
            _vllm_info(out, text)
    return out


def _put(out: Probe, key: str, value: object, source: str) -> None:
    if value is None or value == "":
        return
    out.env[key] = str(value)
    out.env_source[key] = source


async def _get_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> object:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                return await resp.json(content_type=None)
    return None


async def _get_text(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str | None:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError):
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                return await resp.text()
    return None


def _llamacpp_props(out: Probe, props: dict[str, object]) -> None:
    """llama.cpp `/props`: build, slots (its max_num_seqs), context size, model file."""
    src = "/props"
    _put(out, "framework", "llama.cpp", src)
    _put(out, "framework_version", props.get("build_info"), src)
    _put(out, "engine.max_num_seqs", props.get("total_slots"), src)
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict):
        _put(out, "engine.n_ctx", settings.get("n_ctx"), src)
    path = props.get("model_path")
    if isinstance(path, str) and path:
        _put(out, "engine.model_file", path.replace("\\", "/").rsplit("/", 1)[-1], src)


def _vllm_info(out: Probe, text: str) -> None:
    """vLLM's `*_info` gauges (`vllm:cache_config_info{block_size="16",…} 1`): their labels are config."""
    for line in text.splitlines():
        if line.startswith("#") or "_info{" not in line:
            continue
        name, _, rest = line.partition("{")
        labels = rest.rpartition("}")[0]
        for part in _split_labels(labels):
            k, _, v = part.partition("=")
            k, v = k.strip(), v.strip().strip('"')
            if k in _VLLM_FLAGS and v:
                _put(out, f"engine.{k}", v, f"/metrics {name.strip()}")
    if "engine.dtype" in out.env:
        _put(out, "precision", out.env["engine.dtype"], out.env_source["engine.dtype"])
    if "engine.tensor_parallel_size" in out.env:
        _put(out, "gpu_count", out.env["engine.tensor_parallel_size"], out.env_source["engine.tensor_parallel_size"])


def _split_labels(labels: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in labels:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def sim_env(opts: dict[str, str]) -> Probe:
    """What a simulated target states about itself: its GPU, precision and engine flags (from the sim's
    own resolved config, the same one it runs)."""
    from slogate.replay.sim.config import build
    from slogate.replay.sim.server import SIM_VERSION

    spec = build(sim_config(opts))
    out = Probe(models=[spec.served_model], server_version=SIM_VERSION, kind="slogate-sim")
    src = "sim config"
    c = spec.config
    for key, value in (("gpu", spec.gpu.name), ("gpu_count", c.tp), ("gpu_memory", f"{spec.gpu.memory_gib:g} GiB"),
                       ("framework", "slogate-sim"), ("framework_version", SIM_VERSION), ("precision", c.dtype),
                       ("engine.max_num_seqs", spec.max_num_seqs),
                       ("engine.max_num_batched_tokens", spec.max_num_batched_tokens),
                       ("engine.max_model_len", spec.max_model_len), ("engine.tp", c.tp),
                       ("engine.kv_dtype", c.kv_dtype), ("engine.kv_blocks", spec.kv_blocks),
                       ("engine.prefix_caching", c.prefix_caching), ("engine.scheduler", c.scheduler),
                       ("engine.timing", c.timing)):
        _put(out, key, value, src)
    return out


def apply_probe(env, info: Probe, target: str = ""):  # type: ignore[no-untyped-def]
    """Fill the Environment's hardware/engine fields: what the server stated first, then the sim's own
    config for a `sim:` target, then `--label` (gpu=H100, framework=vllm, driver=…); the rest stay None."""
    sources = [info]
    spec = parse_target(target) if target.startswith("sim:") else None
    if spec is not None and spec.sim is not None:
        with contextlib.suppress(UsageError, SystemExit):
            sources.append(sim_env(spec.sim))
    label_probe = Probe()
    for key, value in env.labels.items():
        k = key if key in ENV_FIELDS else f"engine.{key}" if key in _VLLM_FLAGS or key in ("tp", "prefix_caching") else None
        if k:
            _put(label_probe, k, value, "label")
    sources.append(label_probe)
    for src in sources:
        for key, value in src.env.items():
            if key.startswith("engine."):
                flag = key.removeprefix("engine.")
                if flag not in env.engine:
                    env.engine = {**env.engine, flag: value}
                    env.recorded_by = {**env.recorded_by, key: src.env_source[key]}
            elif getattr(env, key, None) is None:
                setattr(env, key, int(value) if key == "gpu_count" and value.isdigit() else value)
                env.recorded_by = {**env.recorded_by, key: src.env_source[key]}
    return env


def _kind(owners: set[str], version_body: object, server_header: str) -> str:
    text = (msgspec.json.encode(version_body).decode().lower() if version_body is not None else "") + " ".join(owners)
    if "slogate" in text:
        return "slogate-sim"
    if "sglang" in text:
        return "sglang"
    if "vllm" in owners:
        return "vllm"
    if "llamacpp" in owners or "me" in owners or "llama" in server_header.lower():
        return "llamacpp"
    if isinstance(version_body, dict) and set(version_body) == {"version"}:
        return "vllm"  # vLLM's /version is exactly {"version": "..."}
    return "unknown"


def _path_like(model_id: str) -> bool:
    """An id that is a file path (llama.cpp lists `/models/gemma.gguf`): such servers accept any name."""
    return "/" in model_id and (model_id.startswith(("/", ".", "~")) or model_id.endswith((".gguf", ".bin", ".safetensors")))


def check_model(model: str | None, models: list[str], url: str) -> str | None:
    """None when `--model` is served; a warning when the server lists a path-like id (it accepts any
    name); otherwise a `UsageError` naming what the server serves."""
    if not model or not models or model in models:
        return None
    if any(_path_like(m) for m in models):
        return (f"warning: {url} lists {', '.join(models)} (a file path); sending model {model!r} as given "
                "(servers that list a path accept any name)")
    raise UsageError(f"model {model!r} is not served by {url} (it serves {', '.join(models)}); fix --model")
