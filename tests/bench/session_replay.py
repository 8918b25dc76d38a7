"""Session replay benchmark: many concurrent agentic sessions against a constant-timing sim, over HTTP.

Writes N synthetic session files (T turns each, exponential think times, growing prefixes), replays
them with `--session-start poisson:rate=R` and measures how late each turn is sent after its
predecessor's completion + think (the session-timing lag), the sessions/s the replay sustained, and
the same workload's virtual-time replay speed. Prints a table; writes tests/bench/results/session_replay.json.

    .venv/bin/python tests/bench/session_replay.py [--sessions 200] [--turns 6] [--think 0.5] [--rate 20]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench_output import aligned_rows, save_json

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def write_sessions(folder: Path, n: int, turns: int, think: float, seed: int) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for s in range(n):
        ids, nxt, t, reqs = list(range(1, 9)), 9, 0.0, []
        for k in range(turns):
            th = 0.0 if k == 0 else rng.expovariate(1 / think)
            t += th
            reqs.append({"t": round(t, 6), "type": "n", "model": "m", "in": 16 * len(ids), "out": 8,
                         "hash_ids": list(ids), "think_time": th, "api_time": 0.05})
            t += 0.05
            grow = rng.randint(1, 4)
            ids += range(nxt, nxt + grow)
            nxt += grow
        p = folder / f"s{s:04d}.json"
        p.write_text(json.dumps({"block_size": 16, "hash_id_scope": "local", "requests": reqs}))
        paths.append(p)
    return paths


def turn_lags(records) -> list[float]:
    by = defaultdict(list)
    for r in records:
        by[r.session].append(r)
    lags = []
    for turns in by.values():
        turns.sort(key=lambda r: r.turn)
        for prev, r in itertools.pairwise(turns):
            lags.append(r.t - (prev.t + prev.e2e) - (r.think or 0.0))
    return sorted(lags)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * (len(values) - 1)))]


def main() -> int:
    from slogate.replay.cli.replay import build_workload, parser
    from slogate.replay.run import ReplayOptions, replay
    from tests.simserver import start_sim

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--think", type=float, default=0.5, help="mean think time (s)")
    p.add_argument("--rate", type=float, default=20.0, help="session starts per second (Poisson)")
    p.add_argument("--seed", type=int, default=1)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write_sessions(Path(tmp), ns.sessions, ns.turns, ns.think, ns.seed)
        args = [tmp, "--target", "x", "--session-start", f"poisson:rate={ns.rate:g}", "--seed", str(ns.seed)]
        w = build_workload(parser().parse_args(args))[0]
        t0 = time.perf_counter()
        virtual = replay(w, ReplayOptions(target="sim:h100-sxm/llama-3-8b?timing=constant&ttft_ms=10&itl_ms=2",
                                          virtual=True, endpoint="completions"))
        virtual_wall = time.perf_counter() - t0
        with start_sim(timing="constant", ttft_ms=10, itl_ms=2) as sim:
            t0 = time.perf_counter()
            live = replay(w, ReplayOptions(target=sim.url, endpoint="completions", tokenizer="none",
                                           keep_chunk_times=False))
            live_wall = time.perf_counter() - t0
    del files
    lags = turn_lags(live.records)
    vl = turn_lags(virtual.records)
    span = max(r.t + r.e2e for r in live.records) - min(r.t for r in live.records)
    result = {
        "sessions": ns.sessions, "turns_per_session": ns.turns, "think_mean_s": ns.think, "start_rate": ns.rate,
        "requests": len(live.records), "failed": live.results.summary.failed,
        "sessions_per_s": ns.sessions / span, "turns_per_s": len(live.records) / span,
        "turn_lag_p50_ms": pct(lags, 0.5) * 1e3, "turn_lag_p99_ms": pct(lags, 0.99) * 1e3,
        "turn_lag_max_ms": lags[-1] * 1e3, "virtual_turn_lag_max_us": max(abs(x) for x in vl) * 1e6,
        "live_wall_s": live_wall, "virtual_wall_s": virtual_wall,
        "virtual_sessions_per_wall_s": ns.sessions / virtual_wall, "client_cpu_s": live.client_cpu_s,
    }
    rows = [["sessions × turns", "sessions/s", "turn lag p50 / p99 / max (HTTP)", "virtual lag max", "virtual speed"],
            [f"{ns.sessions} × {ns.turns}", f"{result['sessions_per_s']:.1f}",
             f"{result['turn_lag_p50_ms']:.2f} / {result['turn_lag_p99_ms']:.2f} / {result['turn_lag_max_ms']:.2f} ms",
             f"{result['virtual_turn_lag_max_us']:.3f} µs", f"{result['virtual_sessions_per_wall_s']:.0f} sessions/s"]]
    print("\n".join(aligned_rows(rows)))
    save_json(REPO / "tests" / "bench" / "results" / "session_replay.json", result)
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
