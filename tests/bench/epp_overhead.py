"""EPP overhead benchmark: the same streaming load direct, through `slogate gateway`, through Envoy alone,
and through Envoy + `slogate epp` (deploy/envoy-epp.yaml), in interleaved rounds against one
constant-timing `slogate sim` (`.venv/bin/python tests/bench/epp_overhead.py`).

CPU per request is reported per process (Envoy and the EPP apart, and their sum); added TTFT is
against the direct run of the same round. The saturation scenario gives what one EPP replica
sustains (req/s). Prints a table of medians and writes tests/bench/results/epp_overhead.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO), str(HERE)]

from bench_output import save_json  # noqa: E402
from gateway_overhead import (  # noqa: E402
    Scenario,
    request_body,
    run_round,
    start_proxy,
    summarize_round,
    tree_cpu_seconds,
)

from tests.bench.epp_envoy import envoy_epp  # noqa: E402
from tests.servers import Server  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

TARGETS = ("direct", "slogate", "envoy", "envoy+epp")
SCENARIOS = {
    "poisson": Scenario("poisson", "(a) 50 req/s Poisson, 32-token streams", "poisson", 20, 5, rate=50),
    "poisson8": Scenario("poisson8", "(a') 50 req/s Poisson, 8-token streams", "poisson", 20, 5, rate=50,
                         max_tokens=8),
    "saturation": Scenario("saturation", "(c) saturation, closed loop, 1 ms sim delays, 8-token streams", "closed",
                           1, 1, concurrency=64, max_tokens=8),
}


def run_scenario(sc: Scenario, args: argparse.Namespace, pool: ProcessPoolExecutor) -> dict:
    rounds: dict[str, list[dict]] = {t: [] for t in TARGETS}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="slogate-bench-epp-")))
        sim = stack.enter_context(start_sim(timing="constant", ttft_ms=sc.ttft_ms, itl_ms=sc.itl_ms))
        with urllib.request.urlopen(sim.url + "/v1/models", timeout=5) as resp:
            model = json.load(resp)["data"][0]["id"]
        body = request_body(model, sc.max_tokens)
        servers: dict[str, Server] = {"direct": sim}
        pids: dict[str, dict[str, int]] = {"direct": {}}
        for name in ("slogate", "envoy"):
            (tmp / name).mkdir()
            servers[name] = stack.enter_context(start_proxy(name, sim, tmp / name))
            pids[name] = {name: servers[name].proc.pid}
        (tmp / "epp").mkdir()
        envoy, epp = stack.enter_context(envoy_epp(
            [sim.url.removeprefix("http://")], tmp / "epp", "--trace-dir", str(tmp / "epp" / "trace"),
            "--slo", "default:ttft=0.5,tpot=0.1", env={"SLOGATE_TRACE_SALT": "bench"}))
        servers["envoy+epp"] = envoy
        pids["envoy+epp"] = {"envoy": envoy.proc.pid, "epp": epp.proc.pid}
        warm = Scenario("warmup", "", "closed", 0, 0, concurrency=sc.concurrency or 16)
        for name in TARGETS:
            run_round(pool, args.workers, servers[name].url, warm, body, 1.5, seed=0)
        for r in range(args.rounds):
            order = TARGETS[r % len(TARGETS):] + TARGETS[: r % len(TARGETS)]
            for name in order:
                cpu0 = {k: tree_cpu_seconds(p) for k, p in pids[name].items()}
                res = run_round(pool, args.workers, servers[name].url, sc, body, args.duration, seed=r + 1)
                time.sleep(0.3)  # post-response work (trace writer) lands in this round
                cpu = {k: tree_cpu_seconds(p) - cpu0[k] for k, p in pids[name].items()}
                summary = summarize_round(res, args.duration, sum(cpu.values()) if cpu else None)
                n = summary["requests"]
                for k, v in cpu.items():
                    summary[f"cpu_us_per_request_{k}"] = v * 1e6 / n if n else None
                summary["loadavg_1m"] = os.getloadavg()[0]
                rounds[name].append(summary)
                parts = " ".join(f"{k} {summary[f'cpu_us_per_request_{k}']:.0f}" for k in cpu if n)
                print(f"  {sc.name:<10} round {r + 1} {name:<9} n={n} err={summary['errors']} "
                      f"ttft p50 {summary['ttft_p50_ms'] or 0:.2f} p99 {summary['ttft_p99_ms'] or 0:.2f} ms "
                      f"{summary['req_per_s']:.0f} req/s  cpu us/req {parts}  load {summary['loadavg_1m']:.1f}",
                      flush=True)
    return {"scenario": asdict(sc), "rounds": rounds, "summary": combine(rounds)}


def _median(rs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def combine(rounds: dict[str, list[dict]]) -> dict:
    out: dict[str, dict] = {}
    direct = rounds["direct"]
    for name, rs in rounds.items():
        row = {key: _median(rs, key) for key in {k for r in rs for k in r if k.startswith("cpu_us_per_request")}}
        for key in ("req_per_s", "errors", "ttft_p50_ms", "ttft_p99_ms"):
            row[key] = _median(rs, key)
        for key in ("ttft_p50_ms", "ttft_p99_ms"):
            diffs = [p[key] - d[key] for p, d in zip(rs, direct, strict=False)
                     if p[key] is not None and d[key] is not None]
            row["added_" + key] = statistics.median(diffs) if diffs else None
        out[name] = row
    return out


def table(results: list[dict]) -> str:
    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = []
    for res in results:
        sc = res["scenario"]
        lines.append(f"\n{sc['title']}  (medians of {len(res['rounds']['direct'])} rounds; TTFT added vs direct)")
        lines.append("| target | +TTFT p50 ms | +TTFT p99 ms | CPU µs/req total | Envoy | EPP | req/s | errors |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for name, row in res["summary"].items():
            if name == "direct":
                continue
            lines.append(
                f"| {name} | {f(row['added_ttft_p50_ms'], '+.2f')} | {f(row['added_ttft_p99_ms'], '+.2f')} | "
                f"{f(row.get('cpu_us_per_request'), '.0f')} | {f(row.get('cpu_us_per_request_envoy'), '.0f')} | "
                f"{f(row.get('cpu_us_per_request_epp'), '.0f')} | {f(row['req_per_s'], '.0f')} | "
                f"{f(row['errors'], '.0f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per scenario (medians reported)")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of load per target per round")
    ap.add_argument("--workers", type=int, default=2, help="client processes")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "epp_overhead.json")
    args = ap.parse_args(argv)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario {sorted(unknown)}")
    results = []
    load_at_start = os.getloadavg()
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn")) as pool:
        for name in args.scenarios.split(","):
            print(SCENARIOS[name].title, flush=True)
            results.append(run_scenario(SCENARIOS[name], args, pool))
    print(table(results))
    env = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
           "loadavg_at_start": load_at_start, "loadavg_at_end": os.getloadavg(), "argv": sys.argv}
    save_json(args.json, {"environment": env, "results": results})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
