"""Replay pacing accuracy at high rate: a constant rate (default 5,000 req/s) for 20 s of tiny requests.

The upstream is the bench's own `fast_upstream.py` (the same 4-token SSE stream for every request,
tens of µs per request, `--upstream-procs` processes on one port) so the client, not the server, is
what is measured; `--upstream sim` uses `slogate sim --timing constant` (TTFT = ITL = 1 ms) with
`--replicas` processes instead (one Python sim saturates a core near 2,000 req/s). Prints a table and
writes tests/bench/results/replay_accuracy_<upstream>.json: offered vs achieved send rate, schedule
lag p50/p99/max, and the client's CPU time per request.

    .venv/bin/python tests/bench/replay_accuracy.py [--rate 5000] [--duration 20] [--workers N] [--upstream fast|sim]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from bench_output import save_json

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> int:
    from slogate.replay.profiles import synthesize
    from slogate.replay.run import ReplayOptions, replay
    from tests.servers import free_port, running
    from tests.simserver import start_sim

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=None, help="sender processes (default: auto)")
    p.add_argument("--upstream", choices=("fast", "sim"), default="fast")
    p.add_argument("--upstream-procs", type=int, default=1, help="fast upstream processes on one port (default 1)")
    p.add_argument("--replicas", type=int, default=2, help="--upstream sim: sim processes, one port each (default 2)")
    ns = p.parse_args()
    w = synthesize(f"constant:rate={ns.rate:g}", duration_s=ns.duration, input_tokens="fixed:8", output_tokens="fixed:4")
    with contextlib.ExitStack() as stack:
        if ns.upstream == "sim":
            sim = stack.enter_context(start_sim(timing="constant", ttft_ms=1, itl_ms=1, replicas=ns.replicas))
            target = ",".join(sim.urls) if ns.replicas > 1 else sim.url  # type: ignore[attr-defined]
            options = ReplayOptions(target=target, endpoint="completions", workers=ns.workers, keep_chunk_times=False)
        else:
            port = free_port()
            cmd = [sys.executable, str(REPO / "tests" / "bench" / "fast_upstream.py"), "--port", str(port),
                   "--procs", str(ns.upstream_procs)]
            upstream = stack.enter_context(running(cmd, port, ready_path="/v1/models"))
            options = ReplayOptions(target=upstream.url, endpoint="completions", workers=ns.workers,
                                    keep_chunk_times=False, model="bench", tokenizer="none", force_output="none")
        t0 = time.perf_counter()
        out = replay(w, options)
        wall = time.perf_counter() - t0
    s = out.results.summary
    lag = s.schedule_lag_s
    result = {
        "offered_rate_rps": s.offered_rate_rps,
        "send_rate_rps": s.send_rate_rps,
        "rate_error": (s.send_rate_rps / s.offered_rate_rps - 1) if s.offered_rate_rps and s.send_rate_rps else None,
        "completed_rate_rps": s.request_rate_rps,
        "requests": s.requests,
        "failed": s.failed,
        "lag_p50_ms": lag.p50 * 1e3 if lag.p50 is not None else None,
        "lag_p99_ms": lag.p99 * 1e3 if lag.p99 is not None else None,
        "lag_max_ms": lag.max * 1e3 if lag.max is not None else None,
        "ttft_p50_ms": s.ttft_s.p50 * 1e3 if s.ttft_s.p50 is not None else None,
        "e2e_p99_ms": s.e2e_s.p99 * 1e3 if s.e2e_s.p99 is not None else None,
        "client_cpu_s": out.client_cpu_s,
        "client_cpu_per_request_us": out.client_cpu_s / max(s.requests, 1) * 1e6,
        "workers": out.results.environment.workers,
        "upstream": ns.upstream if ns.upstream == "fast" else f"sim x{ns.replicas}",
        "upstream_procs": ns.upstream_procs if ns.upstream == "fast" else ns.replicas,
        "degraded": s.degraded,
        "degraded_reasons": s.degraded_reasons,
        "wall_s": wall,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "within_1pct": bool(s.send_rate_rps and s.offered_rate_rps and s.send_rate_rps >= 0.99 * s.offered_rate_rps),
    }
    width = max(map(len, result))
    print(f"replay accuracy: constant {ns.rate:g} req/s for {ns.duration:g} s, 8 in / 4 out tokens, upstream {result['upstream']}")
    for k, v in result.items():
        print(f"  {k:<{width}}  {v:.3f}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    dest = REPO / "tests" / "bench" / "results" / f"replay_accuracy_{ns.upstream}.json"
    save_json(dest, result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
