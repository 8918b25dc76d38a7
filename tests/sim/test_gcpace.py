"""The GC pacer: collections only when every engine has time for them, a watchdog when none ever has.

Real `gc` collections of real reference cycles; the engines' clocks are RealClocks whose due times the
tests set. Over HTTP: a streaming sim collects in idle time and exports the counts on /metrics.
"""

from __future__ import annotations

import asyncio
import gc
import math
import re
import time
import weakref

import aiohttp
import pytest

from slogate.replay.sim.clock import RealClock
from slogate.replay.sim.gcpace import PILE_UP, YOUNG_THRESHOLD, GcPacer


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def garbage_cycle() -> weakref.ref[Node]:
    """Make enough young cyclic garbage for a young collection to be due; return a probe on one cycle."""
    probe = Node()
    for _ in range(2 * YOUNG_THRESHOLD):
        Node()
    return weakref.ref(probe)


async def test_collects_only_when_every_engine_has_time() -> None:
    pacer = GcPacer()
    busy, idle = RealClock(pacer), RealClock(pacer)
    pacer.install()
    try:
        assert not gc.isenabled()
        probe = garbage_cycle()
        busy.rest(time.perf_counter() + 0.0002)  # next step in 0.2 ms: no time for a collection
        idle.rest(math.inf)
        assert probe() is not None
        assert sum(pacer.collections.values()) == 0
        busy.rest(time.perf_counter() + 0.5)  # both engines asleep long enough
        assert probe() is None
        assert pacer.collections[0, "idle"] + pacer.collections[1, "idle"] == 1
        assert pacer.collections[0, "forced"] == pacer.collections[1, "forced"] == 0
    finally:
        pacer.uninstall()
    assert gc.isenabled()


async def test_waking_an_idle_engine_takes_its_slack_away() -> None:
    pacer = GcPacer()
    clock = RealClock(pacer)
    pacer.install()
    try:
        clock.rest(math.inf)
        assert pacer.slack(time.perf_counter()) == math.inf
        clock.wake()
        assert pacer.slack(time.perf_counter()) <= 0
        clock.rest(time.perf_counter() + 1.0)
        clock.wake()  # a request while the engine sleeps mid-step: its step time stands
        assert 0.5 < pacer.slack(time.perf_counter()) <= 1.0
    finally:
        pacer.uninstall()


async def test_watchdog_forces_a_full_collection_when_engines_never_rest() -> None:
    pacer = GcPacer(full_max_age_s=0.05, watchdog_s=0.02)
    clock = RealClock(pacer)
    pacer.install()
    try:
        node = Node()
        gc.collect(0)  # promote the live cycle to the oldest generation...
        gc.collect(1)
        probe = weakref.ref(node)
        del node  # ...then drop it: only a full collection can free it now
        gc.collect(1)
        assert probe() is not None
        clock.next_due = time.perf_counter()  # always busy: no slack ever
        await asyncio.sleep(0.3)
        assert pacer.collections[2, "forced"] >= 1
        assert probe() is None
        assert pacer.collections[2, "idle"] == 0
    finally:
        pacer.uninstall()


async def test_engines_that_never_rest_hand_collection_back_to_cpython() -> None:
    pacer = GcPacer(watchdog_s=0.02)
    clock = RealClock(pacer)
    pacer.install()
    try:
        clock.next_due = time.perf_counter()  # busy: a token is always due
        keep = [Node() for _ in range(PILE_UP * YOUNG_THRESHOLD)]  # young objects pile up, nothing rests
        await asyncio.sleep(0.2)
        assert gc.isenabled() and pacer.handovers == 1
        garbage_cycle()
        garbage_cycle()  # CPython's own young collections run now, and are counted
        assert pacer.collections[0, "automatic"] + pacer.collections[1, "automatic"] >= 1
        clock.rest(time.perf_counter() + 0.0001)  # a rest too short for a middle collection: CPython keeps it
        assert gc.isenabled()
        clock.rest(time.perf_counter() + 1.0)  # engines rest again: back to idle-time collection
        assert not gc.isenabled()
        del keep
    finally:
        pacer.uninstall()


async def test_pause_cost_is_learnt_from_real_collections() -> None:
    pacer = GcPacer()
    RealClock(pacer).rest(math.inf)
    pacer.install()
    try:
        pacer.cost = [10.0, 10.0, 10.0]  # collections believed to take 10 s never fit a 1 s slack
        garbage_cycle()
        clock = pacer.clocks[0]
        clock.rest(time.perf_counter() + 1.0)  # type: ignore[attr-defined]
        assert sum(pacer.collections.values()) == 0
        clock.rest(math.inf)  # type: ignore[attr-defined]
        assert sum(pacer.collections.values()) == 1
        assert min(pacer.cost) < 10.0  # the measured pause lowered the estimate
    finally:
        pacer.uninstall()


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
async def test_streaming_server_collects_in_idle_time(sim_server) -> None:
    sim = sim_server(seed=3)
    body = {"model": "llama-3-8b", "prompt": "a b c d", "max_tokens": 200, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as http:

        async def one() -> int:
            async with http.post(sim.url + "/v1/completions", json=body) as r:
                return (await r.read()).count(b'"text":"')

        assert await asyncio.gather(*(one() for _ in range(40))) == [200] * 40
        async with http.get(sim.url + "/metrics") as r:
            text = await r.text()

    def value(generation: int, trigger: str) -> float:
        m = re.search(rf'slogate_sim_gc_collections_total\{{generation="{generation}",trigger="{trigger}"\}} (\S+)',
                      text)
        assert m, text
        return float(m.group(1))

    assert value(0, "idle") + value(1, "idle") > 0
    assert value(0, "forced") == value(1, "forced") == value(2, "forced") == 0
    assert "slogate_sim_gc_pause_seconds_total" in text and "slogate_sim_gc_handovers_total 0.0" in text
