"""Request-body memory of the gateway: N concurrent large bodies through it to the simulator, and the rise
of the gateway's peak RSS (VmHWM, reset before the burst) over its RSS just before, as a multiple of the
bodies' total. Runs this build and, with --baseline PYTHON (another checkout's venv), that one too.

    .venv/bin/python tests/bench/body_memory.py [--bodies 8] [--mib 30] [--baseline /work/main/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gateway.test_body_budget import padded, post, proc_status
from tests.servers import free_port, running
from tests.simserver import start_sim

MiB = 1 << 20


def burst(python: str, sim_url: str, n: int, size: int, extra: list[str]) -> dict:
    port, admin = free_port(), free_port()
    cmd = [python, "-m", "slogate", "gateway", "--listen", f"127.0.0.1:{port}", "--admin-listen",
           f"127.0.0.1:{admin}", "--upstream", sim_url, *extra]
    with running(cmd, port, ready_path="/healthz", env={"SLOGATE_TRACE_SALT": "bench"}) as gw:
        warm: list = []
        post(port, padded(200), warm)
        pid = gw.proc.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        base = proc_status(pid, "VmRSS")
        body, out = padded(size), []
        threads = [threading.Thread(target=post, args=(port, body, out)) for _ in range(n)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        seconds = time.monotonic() - t0
        peak = proc_status(pid, "VmHWM")
    ok = sum(1 for status, _ in out if status == 200)
    return {"base_mib": base / MiB, "peak_mib": peak / MiB, "increase_mib": (peak - base) / MiB,
            "x_total": (peak - base) / (n * size), "seconds": seconds, "ok": ok}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bodies", type=int, default=8)
    p.add_argument("--mib", type=int, default=30)
    p.add_argument("--baseline", metavar="PYTHON", help="also run the gateway of this interpreter's slogate")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "body_memory.json"))
    ns = p.parse_args()
    builds = [("this", sys.executable)] + ([("baseline", ns.baseline)] if ns.baseline else [])
    rows = []
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, tempfile.TemporaryDirectory() as tmp:
        for config, extra in (("default", []), ("--trace-dir", ["--trace-dir", f"{tmp}/trace"])):
            for build, python in builds:  # interleaved: the same box load for both builds
                row = {"build": build, "config": config, **burst(python, sim.url, ns.bodies, ns.mib * MiB, extra)}
                rows.append(row)
                print(f"{build:9} {config:12} base {row['base_mib']:6.1f} MiB  peak {row['peak_mib']:7.1f} MiB  "
                      f"+{row['increase_mib']:6.1f} MiB = {row['x_total']:.2f}x of {ns.bodies} x {ns.mib} MiB  "
                      f"{row['seconds']:5.1f} s  {row['ok']}/{ns.bodies} ok", flush=True)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps({"bodies": ns.bodies, "mib": ns.mib, "rows": rows}, indent=2))
    return 0 if all(r["ok"] == ns.bodies for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
