"""Start a `slogate sim` server subprocess for any test: `with start_sim(...) as sim: sim.url`.

Shared by the gateway, replay and sim tests (stable signature). Built on tests/servers.py
`running()`, so the server always stops; it never leaves a process behind.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

from tests.servers import Server, free_port, free_ports, running


@contextlib.contextmanager
def start_sim(
    *,
    gpu: str = "h100-sxm",
    model: str = "llama-3-8b",
    timing: str | Sequence[str] = "roofline",  # a sequence for a model with arguments: ("profile", PATH)
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
    replicas: int = 1,
    seed: int | None = None,
    served_model_name: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_blocks: int | None = None,
    fault: str | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    timeout: float = 30.0,
) -> Iterator[Server]:
    """Run `slogate sim` on free port(s) until the block exits.

    The yielded `Server` has `.url`, `.port`, `.proc`, and `.urls` (one per replica, consecutive
    ports starting at `.port`). `timing="constant"` with `ttft_ms`/`itl_ms` gives fixed timings
    for protocol tests; the default roofline model behaves like vLLM on the named GPU.
    """
    if port is None:
        port = free_port() if replicas == 1 else free_ports(replicas)
    cmd = [sys.executable, "-m", "slogate", "sim", "--port", str(port), "--gpu", gpu, "--model", model]
    cmd += ["--timing", *([timing] if isinstance(timing, str) else timing), "--replicas", str(replicas)]
    optional = {  # flag -> value; a None value leaves the flag out (the sim's default)
        "--ttft-ms": ttft_ms,
        "--itl-ms": itl_ms,
        "--seed": seed,
        "--served-model-name": served_model_name,
        "--max-num-seqs": max_num_seqs,
        "--max-num-batched-tokens": max_num_batched_tokens,
        "--kv-blocks": kv_blocks,
        "--fault": fault,
    }
    for flag, value in optional.items():
        if value is not None:
            cmd += [flag, str(value)]
    cmd += list(extra_args)
    with running(cmd, port, ready_path="/v1/models", timeout=timeout) as server:
        server.urls = [f"http://127.0.0.1:{port + i}" for i in range(replicas)]  # type: ignore[attr-defined]
        yield server
