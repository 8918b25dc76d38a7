"""Closed loop: C requests in flight; each completion sends the next (times are not planned).

The workload carries `concurrency=C` and the request list (or a duration); the runner keeps C
senders busy. Pure and seeded; never sends anything itself.
"""

from __future__ import annotations

import random

from slogate.replay.lengths import Sampler
from slogate.replay.workload import PlannedRequest, Workload, WorkloadError

DEFAULT_REQUESTS_PER_SLOT = 20


def workload(
    params: dict[str, float],
    ins: Sampler,
    outs: Sampler,
    rng: random.Random,
    *,
    requests: int | None,
    duration_s: float | None,
    spec: str,
) -> Workload:
    c = int(params.get("c", params.get("concurrency", 0)))
    if c < 1:
        raise WorkloadError(f"--synthetic {spec!r} needs c=N (requests in flight, ≥ 1)")
    # with a duration and no count the runner cycles through these lengths until time is up
    n = requests if requests is not None else c * DEFAULT_REQUESTS_PER_SLOT
    reqs = [PlannedRequest(t=0.0, input_tokens=ins(rng), output_tokens=outs(rng), index=i) for i in range(n)]
    return Workload(requests=reqs, source=f"synthetic:{spec}", concurrency=c, duration_s=duration_s)
