"""Soak: one `slogate gateway` in front of `slogate sim` under moderate mixed load for `--minutes`.

The mix: good streams, per-request faults (reset, 500, error event, stall past the idle timeout),
the sim's own `--fault` rates, slow readers and clients that hang up mid-stream. Every `--sample-s`
it samples the gateway's RSS, open fds, event-loop lag and /healthz latency, and records written
and dropped; at the end it checks the trend is flat and every request sent became a record.
Usage: `.venv/bin/python tests/bench/soak.py --minutes 60 [--rate 8] [--fault error_rate=0.02]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_output import aligned_rows, save_json

from slogate.traces.reader import read_trace
from tests.realservers import start_gateway
from tests.servers import free_port
from tests.simserver import start_sim

MODEL = "llama-3-8b"
KINDS = (  # (kind, weight, x-slogate-fault header or None)
    ("good", 60, None),
    ("reset", 6, "reset_after=3"),
    ("error", 4, "error=500"),
    ("error_event", 4, "error_after=3"),
    ("stall", 2, "stall_ms=2500,stall_after=2"),  # beyond the gateway's 1 s idle timeout
    ("slow_reader", 8, None),
    ("hang_up", 8, None),
    ("non_stream", 8, None),
)


class Sample(msgspec.Struct):
    minute: float
    rss_mib: float
    fds: int
    loop_lag_ms: float
    healthz_max_ms: float
    written: int
    dropped: int
    sent: int


class Stats:
    def __init__(self) -> None:
        self.sent = 0
        self.by_kind: dict[str, int] = {}
        self.client_errors: dict[str, int] = {}
        self.healthz_ms: list[float] = []


def body(max_tokens: int, stream: bool) -> bytes:
    return msgspec.json.encode({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                                "messages": [{"role": "user", "content": "soak " * 20}]})


async def api_request(session: aiohttp.ClientSession, url: str, kind: str, fault: str | None, stats: Stats) -> None:
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["x-slogate-fault"] = fault
    stats.sent += 1
    stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
    try:
        async with session.post(url + "/v1/chat/completions", data=body(24, kind != "non_stream"),
                                headers=headers) as resp:
            if kind == "hang_up":
                await resp.content.readany()
                resp.close()  # drop the connection mid-stream
                return
            while True:
                piece = await resp.content.readany()
                if not piece:
                    break
                if kind == "slow_reader":
                    await asyncio.sleep(0.05)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        stats.client_errors[type(exc).__name__] = stats.client_errors.get(type(exc).__name__, 0) + 1


async def healthz(session: aiohttp.ClientSession, url: str, stats: Stats) -> None:
    t0 = time.perf_counter()
    async with session.get(url + "/healthz") as resp:
        await resp.read()
    stats.healthz_ms.append((time.perf_counter() - t0) * 1e3)


async def metrics(session: aiohttp.ClientSession, admin: str) -> dict[str, float]:
    async with session.get(admin + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('slogate_trace_records_total{outcome="written"}'):
            out["written"] = float(line.split()[-1])
        elif line.startswith('slogate_trace_records_total{outcome="dropped"}'):
            out["dropped"] = float(line.split()[-1])
        elif line.startswith("slogate_event_loop_lag_seconds "):
            out["lag"] = float(line.split()[-1])
    return out


def proc_sample(pid: int) -> tuple[float, int]:
    rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


async def drive(url: str, admin: str, pid: int, args: argparse.Namespace) -> tuple[list[Sample], Stats]:
    rng = random.Random(args.seed)
    kinds, weights = [k[0::2] for k in KINDS], [k[1] for k in KINDS]
    stats, samples = Stats(), []
    tasks: set[asyncio.Task] = set()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session, aiohttp.ClientSession(timeout=timeout) as probe:
        start = time.perf_counter()
        end = start + args.minutes * 60
        next_send, next_probe, next_sample = start, start, start + args.sample_s
        while (now := time.perf_counter()) < end:
            if now >= next_send:
                kind, fault = rng.choices(kinds, weights)[0]
                task = asyncio.create_task(api_request(session, url, kind, fault, stats))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_send += rng.expovariate(args.rate)
            if now >= next_probe:
                await healthz(probe, url, stats)
                next_probe += 1.0
            if now >= next_sample:
                m = await metrics(probe, admin)
                rss, fds = proc_sample(pid)
                samples.append(Sample(minute=round((now - start) / 60, 2), rss_mib=round(rss, 1), fds=fds,
                                      loop_lag_ms=round(m.get("lag", 0) * 1e3, 2),
                                      healthz_max_ms=round(max(stats.healthz_ms, default=0), 1),
                                      written=int(m.get("written", 0)), dropped=int(m.get("dropped", 0)),
                                      sent=stats.sent))
                stats.healthz_ms.clear()
                print(aligned_rows([list(Sample.__struct_fields__), [str(v) for v in msgspec.structs.astuple(samples[-1])]])[-1],
                      flush=True)
                next_sample += args.sample_s
            await asyncio.sleep(max(0.0, min(next_send, next_probe, next_sample) - time.perf_counter()))
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    return samples, stats


def verdict(samples: list[Sample], written_final: int, sent: int, dropped_final: int) -> list[str]:
    """What is wrong (empty: the soak passed): growth after warm-up, lost or dropped records."""
    problems = []
    steady = samples[max(1, len(samples) // 5):]  # the first fifth (at least one sample) warms up
    if len(steady) >= 3:
        third = max(1, len(steady) // 3)
        early, late = steady[:third], steady[-third:]
        rss0, rss1 = statistics.median(s.rss_mib for s in early), statistics.median(s.rss_mib for s in late)
        if rss1 > rss0 * 1.10 + 8:
            problems.append(f"RSS grew: median {rss0:.1f} MiB early, {rss1:.1f} MiB late")
        fd0, fd1 = max(s.fds for s in early), statistics.median(s.fds for s in late)
        if fd1 > fd0 + 10:
            problems.append(f"open fds grew: max {fd0} early, median {fd1} late")
    if dropped_final:
        problems.append(f"{dropped_final} records dropped")
    if written_final != sent:
        problems.append(f"{sent} requests sent, {written_final} records in the trace")
    return problems


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="slogate-soak-") as tmp:
        trace_dir = Path(tmp) / "trace"
        admin_port = free_port()
        sim_faults = [f"--fault={f}" for f in args.fault]
        with start_sim(timing="constant", ttft_ms=30, itl_ms=8, seed=args.seed, extra_args=sim_faults) as sim:
            gw_args = ("--admin-listen", f"127.0.0.1:{admin_port}", "--idle-timeout", "1",
                       "--trace-flush-interval", "1", "--log-level", "warning")
            with start_gateway(sim.url, trace_dir=trace_dir, extra_args=gw_args) as gw:
                samples, stats = asyncio.run(drive(gw.url, f"http://127.0.0.1:{admin_port}", gw.proc.pid, args))
                code = gw.stop()
                log = gw.log_text()
        records = list(read_trace(trace_dir).records)
    final_dropped = samples[-1].dropped if samples else 0
    problems = verdict(samples, len(records), stats.sent, final_dropped)
    if code != 0:
        problems.append(f"gateway exited with {code} on SIGTERM")
    return {"minutes": args.minutes, "rate": args.rate, "sim_faults": args.fault, "sent": stats.sent,
            "by_kind": stats.by_kind, "client_errors": stats.client_errors, "records": len(records),
            "samples": [msgspec.to_builtins(s) for s in samples], "problems": problems,
            "log_lines": len(log.splitlines()), "exit_code": code}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0, help="duration (default 60)")
    p.add_argument("--rate", type=float, default=8.0, help="requests per second, Poisson (default 8)")
    p.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default 60)")
    p.add_argument("--fault", action="append", default=[], help="sim --fault (repeatable; default error_rate=0.02, reset_rate=0.02)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    args = p.parse_args(argv)
    if not args.fault:
        args.fault = ["error_rate=0.02", "reset_rate=0.02"]
    print(aligned_rows([list(Sample.__struct_fields__), ["-"] * len(Sample.__struct_fields__)])[0], flush=True)
    result = run(args)
    save_json(Path(args.out), result)
    print(f"sent {result['sent']}, records {result['records']}, by kind {result['by_kind']}, "
          f"client errors {result['client_errors']}, gateway log lines {result['log_lines']}")
    print("PASS" if not result["problems"] else "FAIL: " + "; ".join(result["problems"]))
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
