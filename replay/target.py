"""The target of a replay: an HTTP URL, or `sim:GPU/MODEL[?opts]` (a simulated engine we start).

Parses `--target`, starts the sim in a child process on a free port when asked, and probes the
server (`/v1/models`, `/version`, server kind) for the results' environment. Never sends load.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator

import aiohttp
import msgspec

from slogate.traces.usage import UsageError


class TargetSpec(msgspec.Struct):
    spec: str
    url: str | None = None  # HTTP base URL (None for a sim not started yet)
    sim: dict[str, str] | None = None  # sim options: gpu, model, and query options


class Probe(msgspec.Struct):
    models: list[str] = []
    server_version: str | None = None
    kind: str = "unknown"  # vllm, sglang, llamacpp, slogate-sim, unknown


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


def sim_args(opts: dict[str, str]) -> list[str]:
    """`slogate sim` command-line flags for `sim:` options (tp=4 → --tp 4, flag with no value → --flag)."""
    args: list[str] = []
    for key, value in opts.items():
        flag = f"--{key.replace('_', '-')}"
        args += [flag, value] if value != "" else [flag]
    return args


def sim_config(opts: dict[str, str]):
    """The virtual-time engine config for `sim:` options, parsed exactly as `slogate sim` parses them."""
    from slogate.replay.sim.options import configure

    try:
        return configure(sim_args(opts))[0]
    except SystemExit:
        raise UsageError(f"bad sim option in --target: {sorted(opts)} (see slogate sim --help)") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def start_sim(opts: dict[str, str], *, timeout: float = 30.0) -> AsyncIterator[str]:
    """Run `slogate sim` in a child process on a free port; yields its URL; always stops it.

    Waits on the event loop without blocking it, so a Ctrl-C while the sim starts is handled at once.
    """
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from slogate.cli import main; sys.exit(main())", "sim", "--port", str(port),
           *sim_args(opts)]
    log = tempfile.NamedTemporaryFile(prefix="slogate-sim-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
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
        _stop(proc)  # at teardown: the run is over, a short blocking wait is fine
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


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
    return out


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
