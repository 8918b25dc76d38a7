"""Real clock vs virtual clock: the same small workload gives the same TTFT and E2E medians."""

from __future__ import annotations

import random
import statistics

import msgspec

from slogate.replay.sim.engine import SimConfig, SimRequest, simulate
from tests.sim.realclient import run_plan


def plan(n: int = 24, seed: int = 4) -> list[SimRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(8.0)
        out.append(SimRequest(arrival=t, prompt_tokens=rng.randint(100, 500), output_tokens=24))
    return out


async def test_virtual_matches_real_clock(sim_server):
    """Up to 3 attempts: on 2 shared cores another process can starve the server for tens of ms,
    which delays real tokens the virtual clock knows nothing about. The 10 % bound is unchanged.
    Each attempt gets a fresh server (an empty prefix cache, like the virtual run)."""
    reqs = plan()
    for _attempt in range(3):
        sim = sim_server(gpu="l4", seed=2)
        real, sent = await run_plan(sim.url, reqs)
        # the virtual run gets the arrivals the server really saw (the client may have sent late)
        as_sent = [msgspec.structs.replace(r, arrival=t) for r, t in zip(reqs, sent, strict=True)]
        virtual = simulate(as_sent, SimConfig(gpu="l4", model="llama-3-8b", seed=2))
        assert all(len(ts) == 24 for ts in real)
        v_ttft = statistics.median(r.ttft for r in virtual)
        v_e2e = statistics.median(r.e2e for r in virtual)
        r_ttft = statistics.median(ts[0] for ts in real)
        r_e2e = statistics.median(ts[-1] for ts in real)
        if abs(r_ttft - v_ttft) / v_ttft < 0.10 and abs(r_e2e - v_e2e) / v_e2e < 0.10:
            break
    assert abs(r_ttft - v_ttft) / v_ttft < 0.10, (r_ttft, v_ttft)
    assert abs(r_e2e - v_e2e) / v_e2e < 0.10, (r_e2e, v_e2e)
