"""Routing benchmark: a real trace slice replayed through `slogate gateway` to 4 `slogate sim` replicas.

    python tests/bench/routing.py [--traces DIR] [--seconds 40] [--load 0.8] [--out DIR]

1. Azure code + conv (merged by arrival time) to an equal fleet (4× a100-80g) and a heterogeneous
   one (2× h100-sxm + 2× a100-80g), once per policy: goodput, SLO attainment, TTFT p50/p99, TPOT p99.
2. The same slice on the equal fleet with a long/short pool split versus one shared pool.
3. A Mooncake conversation slice (shared prefixes; 4× h100-sxm with qwen2.5-7b, non-streaming):
   prefix-cache hit rate from the sims' metrics for prefix-affinity versus least-tokens.
The offered rate is `--load` × the fleet's capacity, where a GPU's capacity is the highest rate a
single simulated replica serves with ≥ 95 % SLO attainment (virtual-time replays, seconds each).
Prints tables and writes `routing.json`. Not a timed test: run by hand (about 15 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from bench_output import aligned_rows
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from slogate.traces.metrics import summarize  # noqa: E402
from slogate.traces.reader import read_trace  # noqa: E402
from tests.servers import free_ports, running  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

MODEL = "llama-3-70b"
SIM_ARGS = ("--tp", "4")
SLO = "ttft=2,tpot=100ms"
POLICIES = ("round-robin", "least-requests", "least-tokens", "power-of-two", "prefix-affinity")
FLEETS = {"equal": ("a100-80g",) * 4, "hetero": ("h100-sxm",) * 2 + ("a100-80g",) * 2}
MOONCAKE_MODEL = "qwen2.5-7b"  # 32k context: Mooncake prompts average 14k tokens
MOONCAKE_REQUESTS = 400
AZURE_WINDOW = "80:100000"  # the code trace starts ~77 s after the conv trace
LONG_RULE = "long: prompt_tokens >= 3000"
SHORT_MAX_TOKENS = 3000
PY = sys.executable


def merged_azure(traces: Path, out: Path) -> Path:
    """Azure code + conv rows merged by timestamp (same CSV format, so a text sort is a time sort).
    Uses the 10-minute slices when present, else the full public traces of the same directory."""
    for code, conv in (("azure_code_10min.csv", "azure_conv_10min.csv"),
                       ("AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv")):
        if (traces / code).exists() and (traces / conv).exists():
            break
    else:
        raise SystemExit(f"no Azure code + conv CSVs in {traces}")
    rows: list[str] = []
    header = ""
    for name in (code, conv):
        lines = (traces / name).read_text().splitlines()
        header = lines[0]
        rows += lines[1:]
    out.write_text(header + "\n" + "\n".join(sorted(rows)) + "\n")
    return out


def sim_port(replicas: int) -> int:
    """A first port with `replicas` consecutive ports bindable the way servers bind."""
    return free_ports(replicas)


def replay(trace: Path, target: str, out: Path, *extra: str) -> dict:
    cmd = [PY, "-m", "slogate", "replay", str(trace), "--target", target, "--slo", SLO, "--seed", "1",
           "--out", str(out), "--quiet", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"replay failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return orjson.loads((out / "results.json").read_bytes())


def knee(trace: Path, gpu: str, work: Path, window: str | None) -> float:
    """Highest offered rate (req/s) one virtual replica serves with ≥ 95 % attainment (bisection)."""
    lo, hi = 0.1, 16.0
    for i in range(7):
        mid = (lo * hi) ** 0.5
        extra = ["--virtual", "--rate", f"{mid:.3f}", "--max-requests", "400"]
        if window:
            extra += ["--window", window]
        res = replay(trace, f"sim:{gpu}/{MODEL}?tp=4", work / f"knee-{gpu}-{i}", *extra)
        if (res["summary"]["slo_attainment"] or 0) >= 0.95:
            lo = mid
        else:
            hi = mid
    return lo


def sim_counters(urls: list[str]) -> dict[str, float]:
    """Prefix-cache hits/queries summed over replicas."""
    import urllib.request

    total = {"hits": 0.0, "queries": 0.0}
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "vllm:prefix_cache_hits_total":
                    total["hits"] += s.value
                elif s.name == "vllm:prefix_cache_queries_total":
                    total["queries"] += s.value
    return total


def run(fleet: tuple[str, ...], trace: Path, rate: float, n: int, work: Path, label: str, *,
        policy: str = "least-tokens", pools: tuple[str, ...] = (), long_upstreams: int = 0,
        window: str | None = None, affinity_bytes: int = 1024, model: str = MODEL,
        replay_args: tuple[str, ...] = ()) -> dict:
    out = work / label
    cfg = work / f"{label}.toml"
    lines = ["[routing]", f'policy = "{policy}"', "seed = 1", f"affinity_prefix_bytes = {affinity_bytes}",
             "pools = [" + ", ".join(f'"{p}"' for p in pools) + "]"]
    cfg.write_text("\n".join(lines) + "\n")
    with contextlib.ExitStack() as stack:
        urls: list[tuple[str, str]] = []
        for gpu in dict.fromkeys(fleet):
            count = fleet.count(gpu)
            sim = stack.enter_context(start_sim(gpu=gpu, model=model, replicas=count, seed=1,
                                                extra_args=SIM_ARGS if model == MODEL else (),
                                                port=sim_port(count)))
            urls += [(gpu, u) for u in sim.urls]
        ups = []
        for i, (gpu, url) in enumerate(urls):
            pool = ",pool=long" if i >= len(urls) - long_upstreams else ""
            ups += ["--upstream", f"{url}#name={gpu}-{i}{pool}"]
        port = sim_port(1)
        cmd = [PY, "-m", "slogate", "gateway", "--listen", f"127.0.0.1:{port}", "--config", str(cfg),
               "--admin-listen", f"127.0.0.1:{sim_port(1)}",  # a free port, not the default proxy port + 1
               "--slo", SLO, *ups, "--log-level", "warning"]
        gw = stack.enter_context(running(cmd, port, ready_path="/healthz", env={"SLOGATE_TRACE_SALT": "bench"}))
        extra = ["--rate", f"{rate:.3f}", "--max-requests", str(n), "--model", model, *replay_args]
        if window:
            extra += ["--window", window]
        t0 = time.monotonic()
        res = replay(trace, gw.url, out, *extra)
        wall = time.monotonic() - t0
        cache = sim_counters([u for _, u in urls])
    s = res["summary"]
    records = list(read_trace(out / "requests.jsonl.zst").records)
    short = [r.ttft for r in records if r.input_tokens is not None and r.input_tokens < SHORT_MAX_TOKENS]
    long = [r.ttft for r in records if r.input_tokens is not None and r.input_tokens >= SHORT_MAX_TOKENS]
    return {
        "label": label, "policy": policy, "fleet": "+".join(fleet), "offered_rps": s.get("offered_rate_rps") or rate,
        "requests": s["requests"], "failed": s["failed"], "wall_s": round(wall, 1),
        "good": round((s["slo_attainment"] or 0) * s["requests"]),
        "goodput_rps": s["goodput_rps"], "goodput_tok_s": s["goodput_tokens_per_s"],
        "attainment": s["slo_attainment"], "ttft_p50": s["ttft_s"].get("p50"), "ttft_p99": s["ttft_s"].get("p99"),
        "tpot_p99": s["tpot_s"].get("p99"), "e2e_p50": s["e2e_s"].get("p50"), "e2e_p99": s["e2e_s"].get("p99"), "short_ttft_p99": summarize(short).p99, "long_ttft_p99": summarize(long).p99,
        "prefix_hit_rate": cache["hits"] / cache["queries"] if cache["queries"] else None,
        "degraded": s.get("degraded", False),
    }


def fmt(v: object, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(title: str, rows: list[dict], cols: list[tuple[str, str]]) -> str:
    head = [name for name, _ in cols]
    body = [[fmt(r.get(key)) for _, key in cols] for r in rows]
    return "\n".join([title, *aligned_rows([head, *body])])


MAIN_COLS = [("policy", "policy"), ("offered rps", "offered_rps"), ("n", "requests"), ("fail", "failed"),
             ("good", "good"), ("goodput rps", "goodput_rps"), ("goodput tok/s", "goodput_tok_s"), ("attain", "attainment"),
             ("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"), ("TPOT p99", "tpot_p99")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, default=REPO / "traces" / "samples",
                   help="directory with azure_{code,conv}_10min.csv and mooncake_conversation_10min.jsonl")
    p.add_argument("--seconds", type=float, default=40.0, help="replayed seconds per run")
    p.add_argument("--load", type=float, default=0.8, help="offered load as a fraction of fleet capacity")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--parts", default="policies,pools,mooncake")
    p.add_argument("--fleets", default=",".join(FLEETS))
    p.add_argument("--mooncake-rate", type=float, default=4.0,
                   help="req/s for the Mooncake part (about half the 4 replicas' prefill capacity; its "
                   "14k-token prompts make an SLO-based capacity meaningless)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="slogate-bench-routing-"))
    work.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    azure = merged_azure(args.traces, work / "azure_mixed.csv")
    mooncake = args.traces / "mooncake_conversation_10min.jsonl"
    report: dict = {"slo": SLO, "model": f"{MODEL} tp=4", "load": args.load, "seconds": args.seconds}
    cached = work / "knees.json"  # a re-run in the same --out directory reuses the calibration
    knees = orjson.loads(cached.read_bytes()) if cached.exists() else {}
    for gpu in ("a100-80g", "h100-sxm"):
        if gpu not in knees:
            knees[gpu] = knee(azure, gpu, work, AZURE_WINDOW)
    cached.write_bytes(orjson.dumps(knees))
    report["knee_rps"] = knees
    print(f"capacity per replica (virtual, ≥95% attainment at {SLO}): "
          + ", ".join(f"{g} {r:.2f} req/s" for g, r in knees.items()), flush=True)
    fleets = {k: v for k, v in FLEETS.items() if k in args.fleets.split(",")}
    out_text: list[str] = []
    if "policies" in parts:
        for fleet_name, fleet in fleets.items():
            rate = args.load * sum(knees[g] for g in fleet)
            n = max(50, int(rate * args.seconds))
            rows = []
            for policy in args.policies.split(","):
                row = run(fleet, azure, rate, n, work, f"{fleet_name}-{policy}", policy=policy, window=AZURE_WINDOW)
                print(orjson.dumps(row).decode(), flush=True)
                rows.append(row)
            report[f"policies_{fleet_name}"] = rows
            out_text.append(table(f"\n{fleet_name} fleet ({'+'.join(fleet)}), Azure code+conv, "
                                  f"{rate:.2f} req/s offered", rows, MAIN_COLS))
    if "pools" in parts:
        fleet = FLEETS["equal"]
        rate = args.load * sum(knees[g] for g in fleet)
        n = max(50, int(rate * args.seconds))
        rows = [run(fleet, azure, rate, n, work, "shared-pool", window=AZURE_WINDOW),
                run(fleet, azure, rate, n, work, "long-short-pools", pools=(LONG_RULE,), long_upstreams=1,
                    window=AZURE_WINDOW)]
        for row in rows:
            print(orjson.dumps(row).decode(), flush=True)
        report["pools"] = rows
        out_text.append(table(f"\npools on the equal fleet ({LONG_RULE!r}, 1 of 4 replicas long), least-tokens",
                              rows, [("setup", "label"), *MAIN_COLS[4:], ("short TTFT p99", "short_ttft_p99"),
                                     ("long TTFT p99", "long_ttft_p99")]))
    if "mooncake" in parts and mooncake.exists():
        # Conversations only come back after a while: the first MOONCAKE_REQUESTS requests hold ~43
        # follow-up turns. 14k-token prompts: qwen2.5-7b (32k context) on H100s, non-streaming (hit rate, not TTFT).
        fleet = ("h100-sxm",) * 4
        rate = args.mooncake_rate
        rows = [run(fleet, mooncake, rate, MOONCAKE_REQUESTS, work, f"mooncake-{policy}", policy=policy,
                    affinity_bytes=4096, model=MOONCAKE_MODEL, replay_args=("--no-stream",))
                for policy in ("least-tokens", "prefix-affinity")]
        for row in rows:
            print(orjson.dumps(row).decode(), flush=True)
        report["mooncake"] = rows
        out_text.append(table(f"\nMooncake conversation slice (first {MOONCAKE_REQUESTS} requests), 4× h100-sxm "
                              f"{MOONCAKE_MODEL}, {rate:.2f} req/s offered, non-streaming",
                              rows, [("policy", "policy"), ("prefix-cache hit rate", "prefix_hit_rate"),
                                     ("n", "requests"), ("fail", "failed"), ("E2E p50", "e2e_p50"),
                                     ("E2E p99", "e2e_p99")]))
    print("\n".join(out_text))
    (work / "routing.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(f"\nresults: {work / 'routing.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
