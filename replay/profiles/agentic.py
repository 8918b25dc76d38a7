"""Synthetic agentic sessions: Poisson session arrivals, turns with think time and growing context,
subagents, and a system prompt shared by every session (`--synthetic agentic:sessions=N,...`).

Pure and seeded; never reads a clock. Requests carry session, turn, parent_session and think, so
the replay sends them with session timing.
"""

from __future__ import annotations

import math
import random

import msgspec

from slogate.replay.lengths import Sampler
from slogate.replay.workload import PlannedRequest, Workload, WorkloadError

BLOCK = 64  # tokens per hash id
DEFAULTS = {"sessions": 20.0, "turns": 6.0, "think": 2.0, "growth": 400.0, "subagents": 0.1, "system": 2048.0,
            "rate": 1.0}
MAX_THINK_S = 86400.0  # a day between turns: larger is a think time in ms (or worse) read as s
NOMINAL_TURN_S = 1.0  # recorded-timeline spacing only (session timing sends after the real completion)


def workload(params: dict[str, float], ins: Sampler, outs: Sampler, rng: random.Random, *, spec: str) -> Workload:
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise WorkloadError(f"unknown --synthetic agentic parameter {sorted(unknown)[0]!r}: use "
                            + ", ".join(f"{k}=" for k in DEFAULTS))
    p = {**DEFAULTS, **params}
    if (p["sessions"] < 1 or p["turns"] < 1 or p["rate"] <= 0 or not 0 <= p["subagents"] <= 1
            or min(p["think"], p["growth"], p["system"]) < 0 or p["think"] > MAX_THINK_S):
        raise WorkloadError(f"bad --synthetic {spec!r}: sessions ≥ 1, turns ≥ 1, rate > 0, 0 ≤ subagents ≤ 1, "
                            f"think (0 to {MAX_THINK_S:g} s), growth and system ≥ 0")
    system = list(range(1, math.ceil(p["system"] / BLOCK) + 1))  # the same ids in every session
    next_id = [len(system) + 1]
    reqs: list[PlannedRequest] = []

    def fresh(n: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    def session(name: str, parent: str | None, t0: float, turns: int, depth: int) -> None:
        context = int(p["system"]) + ins(rng)
        ids = system + fresh(max(0, math.ceil(context / BLOCK) - len(system)))
        t = t0
        children = 0
        for k in range(turns):
            think = 0.0 if k == 0 else rng.expovariate(1 / p["think"]) if p["think"] > 0 else 0.0
            t += think
            out = outs(rng)
            reqs.append(PlannedRequest(t=t, input_tokens=context, output_tokens=out, hash_ids=list(ids),
                                       session=name, turn=k, parent_session=parent,
                                       think=think if k or parent else None))
            t += NOMINAL_TURN_S
            if depth == 0 and rng.random() < p["subagents"]:
                children += 1
                session(f"{name}.{children}", name, t + 0.1, max(1, turns // 2), depth + 1)
            grow = out + int(rng.expovariate(1 / p["growth"])) if p["growth"] > 0 else out
            context += grow
            ids += fresh(math.ceil(context / BLOCK) - len(ids))

    start = 0.0
    for i in range(int(p["sessions"])):
        mean = p["turns"]
        turns = max(1, round(rng.uniform(0.5 * mean, 1.5 * mean)))
        session(f"syn{i}", None, start, turns, 0)
        start += rng.expovariate(p["rate"])
    reqs.sort(key=lambda r: r.t)
    reqs = [msgspec.structs.replace(r, index=i) for i, r in enumerate(reqs)]
    return Workload(requests=reqs, source=f"synthetic:{spec}", block_size=BLOCK)
