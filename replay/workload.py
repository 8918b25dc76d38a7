"""A workload: the planned requests of a run (intended time, lengths, prefix blocks) and its transforms.

Pure functions from a list of `PlannedRequest` to another (window, speed, rate, sample, loop,
duration, max-requests, warmup, shard). Never does I/O, never looks at a clock, never builds prompts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import msgspec

from slogate.traces.record import RequestRecord
from slogate.traces.stats import arrival_rate

_MIX = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class PlannedRequest(msgspec.Struct, omit_defaults=True):
    """One request to send: at `t` seconds after the schedule start, with these lengths."""

    t: float
    input_tokens: int
    output_tokens: int
    index: int = 0  # position in the workload (stable across shards: joins records to plans)
    hash_ids: list[int] | None = None  # prefix blocks of `block_size` tokens (same id = same text)
    block_size: int | None = None  # only when it differs from the workload's
    session: str | None = None
    turn: int | None = None  # position within the session (0-based)
    parent_session: str | None = None  # a subagent's parent session
    think: float | None = None  # s after the previous turn's completion (session timing)
    after: int | None = None  # session timing: index of the request whose completion releases this one
    join: list[int] | None = None  # session timing: more requests (subagents' last turns) to wait for
    e2e: float | None = None  # recorded model time of a session turn (tells whether its parent waited)
    endpoint: str | None = None  # per-request override of the run's endpoint
    stream: bool | None = None  # per-request override of the run's stream setting
    warmup: bool = False  # sent, but excluded from the statistics
    seed_key: int | None = None  # text seed of the non-shared tail (loops give each repeat new text)


class Workload(msgspec.Struct, omit_defaults=True):
    """Planned requests in intended-time order, plus how to send them."""

    requests: list[PlannedRequest]
    block_size: int = 512  # tokens per hash block
    source: str = ""  # "trace:FILE" or "synthetic:SPEC"
    concurrency: int | None = None  # closed loop: this many in flight, times ignored
    duration_s: float | None = None  # closed loop: stop sending after this long
    description: list[str] = []  # the transforms applied, in order ("speed=10", ...)

    @property
    def measured(self) -> list[PlannedRequest]:
        return [r for r in self.requests if not r.warmup]


class WorkloadError(ValueError):
    """A transform that cannot apply (names the bad value and the fix)."""


def from_records(records: Iterable[RequestRecord], *, default_block_size: int | None = None) -> list[PlannedRequest]:
    """Planned requests from trace records: times relative to the first, lengths as recorded.

    A record without an output length (a failed request in the trace) is planned with 1 token.
    """
    recs = [r for r in records if r.input_tokens is not None]
    if not recs:
        return []
    t0 = min(r.t for r in recs)
    out = []
    last: dict[str, tuple[int, float]] = {}  # session → (turn, completion) of its latest record
    for i, r in enumerate(sorted(recs, key=lambda r: r.t)):
        turn, think = r.turn, r.think
        if r.session is not None and r.parent_session is None and (turn is None or think is None):
            # a capture's session hash without turns: number them and take think = arrival − previous completion
            prev = last.get(r.session)
            if turn is None:
                turn = 0 if prev is None else prev[0] + 1
            if think is None and prev is not None:
                think = max(0.0, r.t - prev[1])
        if r.session is not None:
            last[r.session] = (turn or 0, r.t + (r.e2e or 0.0))
        out.append(
            PlannedRequest(
                t=r.t - t0,
                input_tokens=max(1, int(r.input_tokens or 1)),
                output_tokens=max(1, int(r.output_tokens or r.max_tokens or 1)),
                index=i,
                hash_ids=list(r.hash_ids) if r.hash_ids else None,
                block_size=r.block_size if r.block_size != default_block_size else None,
                session=r.session,
                turn=turn,
                parent_session=r.parent_session,
                think=think,
                e2e=r.e2e if r.session is not None else None,
            )
        )
    return out


def _reindexed(reqs: Sequence[PlannedRequest]) -> list[PlannedRequest]:
    return [msgspec.structs.replace(r, index=i) for i, r in enumerate(reqs)]


def window(reqs: Sequence[PlannedRequest], start: float, end: float | None) -> list[PlannedRequest]:
    """Requests with start ≤ t < end, shifted so the window starts at 0."""
    if end is not None and end <= start:
        raise WorkloadError(f"bad window {start:g}:{end:g}: END must be after START")
    kept = [r for r in reqs if r.t >= start and (end is None or r.t < end)]
    return _reindexed([msgspec.structs.replace(r, t=r.t - start) for r in kept])


def speed(reqs: Sequence[PlannedRequest], factor: float) -> list[PlannedRequest]:
    """Compress time by `factor` (2 = twice as fast)."""
    if not 0 < factor < math.inf:
        raise WorkloadError(f"bad speed {factor!r}: must be > 0 and finite (2 = twice as fast)")
    return [msgspec.structs.replace(r, t=r.t / factor) for r in reqs]


def mean_rate(reqs: Sequence[PlannedRequest]) -> float | None:
    """Requests per second over the schedule (traces.stats.arrival_rate); None below two distinct times."""
    return arrival_rate([r.t for r in reqs])


def rate(reqs: Sequence[PlannedRequest], target_rps: float) -> list[PlannedRequest]:
    """Rescale time so the mean rate becomes `target_rps` (the shape of the arrivals is kept)."""
    if not 0 < target_rps < math.inf:
        raise WorkloadError(f"bad rate {target_rps!r}: must be > 0 and finite requests/s")
    current = mean_rate(reqs)
    if current is None:
        raise WorkloadError("--rate needs at least two requests at different times")
    return speed(reqs, target_rps / current)


def sample(reqs: Sequence[PlannedRequest], fraction: float, seed: int) -> list[PlannedRequest]:
    """Keep each request with probability `fraction` (seeded), at its original time; requests of a
    session are kept or dropped together with their root session (turns and subagents), so a kept
    conversation starts at its first turn and keeps its prefix chain."""
    if not 0 < fraction <= 1:
        raise WorkloadError(f"bad sample fraction {fraction!r}: must be in (0, 1]")
    rng = random.Random(seed ^ 0x5A17)
    roots = _session_roots(reqs)
    kept: dict[str, bool] = {}
    out = []
    for r in reqs:
        draw = rng.random() < fraction  # one draw per request, as before: a trace without sessions samples as it did
        root = roots.get(r.session) if r.session is not None else None
        keep = draw if root is None else kept.setdefault(root, draw)  # a session keeps its first turn's draw
        if keep:
            out.append(r)
    return _reindexed(out)


def _session_roots(reqs: Sequence[PlannedRequest]) -> dict[str, str]:
    """session → its root session (following `parent_session` up; a cycle or unknown parent ends it)."""
    parent = {r.session: r.parent_session for r in reqs if r.session is not None}
    out: dict[str, str] = {}
    for s in parent:
        root, seen = s, {s}
        while (p := parent.get(root)) is not None and p in parent and p not in seen:
            root = p
            seen.add(p)
        out[s] = root
    return out


def max_requests(reqs: Sequence[PlannedRequest], n: int) -> list[PlannedRequest]:
    if n < 1:
        raise WorkloadError(f"bad --max-requests {n}: must be ≥ 1")
    return list(reqs[:n])


def duration(reqs: Sequence[PlannedRequest], seconds: float, *, loop: bool = False) -> list[PlannedRequest]:
    """Requests with t < seconds; with `loop` the schedule repeats (new text per repeat) to fill it."""
    if not seconds > 0:
        raise WorkloadError(f"bad duration {seconds!r}: must be > 0 seconds")
    if not loop or not reqs:
        return [r for r in reqs if r.t < seconds]
    return looped(reqs, until=seconds)


def looped(reqs: Sequence[PlannedRequest], *, until: float | None = None, times: int | None = None) -> list[PlannedRequest]:
    """Repeat the schedule back to back. Period = span + mean gap. Each repeat gets fresh prefix ids
    and text (a repeat of an identical prompt would be an unrealistic 100 % cache hit)."""
    if not reqs:
        return []
    span = reqs[-1].t - reqs[0].t
    period = span + (span / (len(reqs) - 1) if len(reqs) > 1 and span > 0 else 1.0)
    out: list[PlannedRequest] = []
    k = 0
    while True:
        if times is not None and k >= times:
            break
        shift = k * period
        if until is not None and reqs[0].t + shift >= until:
            break
        for r in reqs:
            t = r.t + shift
            if until is not None and t >= until:
                break
            ids = r.hash_ids if k == 0 or r.hash_ids is None else [((h ^ (k * _MIX)) * _MIX) & _MASK64 for h in r.hash_ids]
            out.append(msgspec.structs.replace(r, t=t, hash_ids=ids, seed_key=(r.seed_key or r.index) + k * (1 << 32)))
        k += 1
    return _reindexed(out)


def mark_warmup(reqs: Sequence[PlannedRequest], *, count: int | None = None, seconds: float | None = None) -> list[PlannedRequest]:
    """Flag the first `count` requests (or those before `seconds`) as warmup: sent, not measured."""
    out = []
    for i, r in enumerate(reqs):
        w = (count is not None and i < count) or (seconds is not None and r.t < seconds)
        out.append(msgspec.structs.replace(r, warmup=True) if w else r)
    return out


def shard(reqs: Sequence[PlannedRequest], i: int, n: int) -> list[PlannedRequest]:
    """Every n-th request starting at i (0-based), keeping intended times and indexes."""
    if not (n >= 1 and 0 <= i < n):
        raise WorkloadError(f"bad shard {i}/{n}: expected I/N with 0 ≤ I < N")
    return list(reqs[i::n])


def split_for_workers(reqs: Sequence[PlannedRequest], workers: int) -> list[list[PlannedRequest]]:
    """Round-robin split of a schedule over worker processes (each keeps intended times); linked
    session turns split by whole root sessions (a turn and its predecessor in one worker)."""
    if any(r.after is not None for r in reqs):
        return split(reqs, workers)
    return [list(reqs[w::workers]) for w in range(workers)]


def _roots(linked: dict[int, PlannedRequest]) -> dict[int, str]:
    """The root session of every linked turn (following `after` up to a turn with none)."""
    root: dict[int, str] = {}

    def find(i: int) -> str:
        seen = []
        while i not in root:
            r = linked[i]
            if r.after is None or r.after not in linked:
                root[i] = r.session or ""
                break
            seen.append(i)
            i = r.after
        for j in seen:
            root[j] = root[i]
        return root[i]

    for i in linked:
        find(i)
    return root


def root_session(reqs: Sequence[PlannedRequest]) -> dict[int, str]:
    """index → root session name (requests without a session map to their own index)."""
    linked = {r.index: r for r in reqs if r.session is not None}
    roots = _roots(linked)
    return {r.index: roots.get(r.index, f"#{r.index}") for r in reqs}


def split(reqs: Sequence[PlannedRequest], n: int) -> list[list[PlannedRequest]]:
    """Whole sessions (with their subagents) per part, round-robin over root sessions."""
    roots = root_session(reqs)
    order: dict[str, int] = {}
    parts: list[list[PlannedRequest]] = [[] for _ in range(n)]
    for r in reqs:
        k = order.setdefault(roots[r.index], len(order))
        parts[k % n].append(r)
    return parts



def parse_window(text: str) -> tuple[float, float | None]:
    """'60:660' → (60, 660); '60:' → (60, None); times in seconds (suffix s/m/h allowed)."""
    if ":" not in text:
        raise WorkloadError(f"bad --window {text!r}: expected START:END in seconds, e.g. 0:600 or 10m:20m")
    a, b = text.split(":", 1)
    start = parse_seconds(a) if a.strip() else 0.0
    end = parse_seconds(b) if b.strip() else None
    return start, end


def parse_seconds(text: str) -> float:
    """'30' / '30s' / '5m' / '1h' / '250ms' → seconds."""
    s = text.strip().lower()
    num, mult = s, 1.0
    for suffix, factor in (("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if s.endswith(suffix):
            num, mult = s[: -len(suffix)], factor
            break
    try:
        return float(num) * mult
    except ValueError:
        raise WorkloadError(f"bad duration {text!r}: expected seconds like 30, 30s, 5m, 1h") from None


def parse_shard(text: str) -> tuple[int, int]:
    try:
        a, b = text.split("/")
        i, n = int(a), int(b)
    except ValueError:
        raise WorkloadError(f"bad --shard {text!r}: expected I/N, e.g. 0/3") from None
    if not (n >= 1 and 0 <= i < n):
        raise WorkloadError(f"bad --shard {text!r}: expected I/N with 0 ≤ I < N")
    return i, n
