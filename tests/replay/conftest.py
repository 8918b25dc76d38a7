"""Shared helpers of the replay tests: sample trace paths and a quiet-machine check for timing asserts."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

from tests.servers import REPO

SAMPLES = REPO / "traces" / "samples"
AZURE = SAMPLES / "azure_conv_10min.csv"
MOONCAKE = SAMPLES / "mooncake_conversation_10min.jsonl"


def wake_noise_p99(seconds: float = 0.5) -> float:
    """p99 lateness of a plain 1 ms sleep on this machine right now (CPU contention floor)."""
    late = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - t - 0.001)
    late.sort()
    return late[int(0.99 * (len(late) - 1))]


_REFERENCE = """
import asyncio, sys, time, orjson, uvloop
from slogate.replay.pacer import sleep_until, start_from_wall_clock
spec = orjson.loads(sys.stdin.buffer.read())

async def main():
    start = start_from_wall_clock(spec["start_unix"])
    lags = []
    for t in spec["times"]:
        await sleep_until(start + t)
        lags.append(time.perf_counter() - start - t)
    lags.sort()
    print(lags[len(lags) // 2], lags[int(0.99 * (len(lags) - 1))], lags[-1])

uvloop.run(main())
"""


class Reference:
    """Lag of a bare pacer (no HTTP) on the same schedule at the same time: this machine's floor."""

    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0


@contextlib.contextmanager
def reference_pacer(times: list[float], start_unix: float) -> Iterator[Reference]:
    """Run a pacer-only process over `times` from `start_unix` while the block runs a replay with the
    same schedule and `--start-at`; stalls that other jobs on the shared cores cause hit both."""
    import orjson

    ref = Reference()
    proc = subprocess.Popen([sys.executable, "-c", _REFERENCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=False, cwd=REPO)
    assert proc.stdin is not None
    proc.stdin.write(orjson.dumps({"times": times, "start_unix": start_unix}))
    proc.stdin.close()
    try:
        yield ref
    finally:
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=max(times, default=0) + 60)
        ref.p50, ref.p99, ref.max = (float(x) for x in out.split())
