"""Session timing: who waits for whom in a workload of sessions, and the `sessions` block of results.

`link` gives each planned turn the request whose completion releases it (`after`) and its think
time; a subagent's first turn follows the parent's turn that preceded the spawn. `summarize`
computes per-session figures from replayed records; `header_value` is the opaque id a replayed
session's requests carry (`--session-header`). Pure functions: no clock, no I/O, no sending.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict
from collections.abc import Sequence

import msgspec

from slogate.replay.workload import PlannedRequest, WorkloadError, _roots, split
from slogate.traces.metrics import percentile
from slogate.traces.record import RequestRecord, is_error

TIMINGS = ("think", "recorded")
ON_ERROR = ("stop", "continue")
SESSION_HEADER = "X-Session-Id"  # replay's default; a gateway captures sessions from it with --session-header X-Session-Id


def header_value(nonce: str, session: str) -> str:
    """The id a replayed session's requests carry in the session header: a digest of the trace's
    session id keyed by the run's nonce (opaque, equal for every turn of the session in this run,
    different in the next run, so two replays through one gateway never join their sessions)."""
    return hashlib.blake2b(session.encode("utf-8", "surrogatepass"), key=nonce.encode()[:64], digest_size=8).hexdigest()


def has_sessions(reqs: Sequence[PlannedRequest]) -> bool:
    """Some session has two turns or a subagent. A gateway capture of one-shot requests (each its own
    one-turn session) has none, so it replays open-loop (and with --concurrency/--loop) as before."""
    seen: set[str] = set()
    for r in reqs:
        if r.session is None:
            continue
        if r.parent_session is not None or r.session in seen:
            return True
        seen.add(r.session)
    return False


def parse_start(text: str) -> tuple[str, float]:
    """'recorded' | 'all' | 'stagger:S' | 'poisson:rate=R' → (mode, parameter)."""
    s = text.strip().lower()
    if s in ("recorded", "all"):
        return s, 0.0
    kind, _, arg = s.partition(":")
    try:
        if kind == "stagger" and arg:
            from slogate.replay.workload import parse_seconds

            gap = parse_seconds(arg)
            if 0 <= gap < math.inf:  # not NaN, not negative, not infinite (no start at all)
                return kind, gap
        if kind == "poisson" and arg.startswith("rate="):
            rate = float(arg.removeprefix("rate="))
            if 0 < rate < math.inf:
                return kind, rate
    except (ValueError, WorkloadError):
        pass
    raise WorkloadError(f"bad --session-start {text!r}: use recorded, all, stagger:SECONDS (≥ 0) or poisson:rate=R "
                        "(R > 0 sessions/s, finite)")


def _think(turn: PlannedRequest, prev: PlannedRequest | None, prev_e2e: float | None) -> float:
    if turn.think is not None:
        return max(0.0, turn.think)
    if prev is None:
        return 0.0
    return max(0.0, turn.t - prev.t - (prev_e2e or 0.0))


def link(reqs: Sequence[PlannedRequest], *, start: str = "recorded", seed: int = 0,
         e2e: dict[int, float] | None = None) -> list[PlannedRequest]:
    """Turns linked to their predecessor (`after` = its index, `think` set); root sessions start at
    their recorded offset or as `start` says. Requests without a session stay open-loop."""
    mode, param = parse_start(start)
    e2e = e2e or {}
    by_session: dict[str, list[PlannedRequest]] = defaultdict(list)
    for r in reqs:
        if r.session is not None:
            by_session[r.session].append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: (r.turn if r.turn is not None else 0, r.t))
    out: dict[int, PlannedRequest] = {}
    roots = sorted((s for s, turns in by_session.items() if not _parent_turn(turns[0], by_session)),
                   key=lambda s: (by_session[s][0].t, s))
    offsets = _offsets(roots, by_session, mode, param, seed)
    spawned: dict[int, list[list[PlannedRequest]]] = defaultdict(list)  # parent turn → its child sessions
    for turns in by_session.values():
        parent = _parent_turn(turns[0], by_session)
        if parent is not None:
            spawned[parent.index].append(turns)
    for turns in by_session.values():
        parent = _parent_turn(turns[0], by_session)
        prev: PlannedRequest | None = parent
        for k, r in enumerate(turns):
            think = _think(r, prev, e2e.get(prev.index) if prev is not None else None)
            after = None if prev is None else prev.index
            join = _joins(r, prev, spawned) if prev is not None and k else []
            if join:  # the trace shows this turn waited for subagents: think counts from the last end
                think = max(0.0, r.t - max(_end(q) for q in [prev, *join]))
            out[r.index] = msgspec.structs.replace(r, after=after, think=think if after is not None or k else r.think,
                                                   turn=k if r.turn is None else r.turn,
                                                   join=[q.index for q in join] or None)
            prev = r
    root_of = _roots(out)
    shifted = []
    for r in reqs:
        p = out.get(r.index, r)
        if p.session is not None:
            root = root_of[p.index]
            shift = offsets[root] - by_session[root][0].t
            p = msgspec.structs.replace(p, t=max(0.0, p.t + shift))
        shifted.append(p)
    shifted.sort(key=lambda r: (r.t, r.index))
    return shifted


def _end(r: PlannedRequest) -> float:
    return r.t + (r.e2e or 0.0)


def _joins(turn: PlannedRequest, prev: PlannedRequest, spawned: dict[int, list[list[PlannedRequest]]]
           ) -> list[PlannedRequest]:
    """Last turns of the subagents spawned at `prev` that ended (as recorded) before `turn` arrived:
    the parent waited for them (a tool call that returns the subagent's answer). Needs recorded e2e."""
    out = []
    for child in spawned.get(prev.index, ()):
        last = child[-1]
        if last.e2e is not None and _end(last) <= turn.t:
            out.append(last)
    return out


def _parent_turn(first: PlannedRequest, by_session: dict[str, list[PlannedRequest]]) -> PlannedRequest | None:
    """The parent's latest turn at or before a child session's first turn (None: a root session)."""
    if first.parent_session is None or first.parent_session not in by_session:
        return None
    before = [p for p in by_session[first.parent_session] if p.t <= first.t]
    return before[-1] if before else None


def _offsets(roots: list[str], by_session: dict[str, list[PlannedRequest]], mode: str, param: float,
             seed: int) -> dict[str, float]:
    if mode == "recorded":
        return {s: by_session[s][0].t for s in roots}
    if mode == "all":
        return dict.fromkeys(roots, 0.0)
    if mode == "stagger":
        return {s: k * param for k, s in enumerate(roots)}
    rng = random.Random(seed ^ 0x5E55)
    t, out = 0.0, {}
    for s in roots:
        out[s] = t
        t += rng.expovariate(param)
    return out


def shard(reqs: Sequence[PlannedRequest], i: int, n: int) -> list[PlannedRequest]:
    """`--shard I/N` with sessions: every N-th root session starting at I."""
    if not (n >= 1 and 0 <= i < n):
        raise WorkloadError(f"bad shard {i}/{n}: expected I/N with 0 ≤ I < N")
    return split(reqs, n)[i]


# -- results -------------------------------------------------------------------------------------

class Dist(msgspec.Struct, omit_defaults=True):
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


class SessionsSummary(msgspec.Struct, omit_defaults=True):
    """`results.json` "sessions": how the sessions of a session-timed replay went."""

    sessions: int = 0
    subagents: int = 0
    turns: int = 0
    failed_turns: int = 0
    unsent_turns: int = 0  # turns never sent: an earlier turn of their session failed (--on-turn-error stop)
    duration_s: Dist = msgspec.field(default_factory=Dist)  # first send → last completion, per session
    time_to_finish_s: Dist = msgspec.field(default_factory=Dist)  # run start → session's last completion
    model_time_s: float = 0.0  # Σ e2e over turns
    think_time_s: float = 0.0  # Σ think over turns that followed another
    ttft_by_turn: dict[str, Dist] = {}  # turn position ("0", "1", …, "8+") → TTFT distribution


def _dist(values: list[float]) -> Dist:
    if not values:
        return Dist()
    values.sort()
    return Dist(p50=percentile(values, 50.0), p90=percentile(values, 90.0), p99=percentile(values, 99.0),
                max=values[-1])


TURN_BUCKETS = 8


def summarize(records: Sequence[RequestRecord]) -> SessionsSummary | None:
    """The sessions block of replayed records (None when no record has a session)."""
    by: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.session is not None:
            by[r.session].append(r)
    if not by:
        return None
    durations, finish = [], []
    ttft: dict[str, list[float]] = defaultdict(list)
    model = think = 0.0
    for turns in by.values():
        first = min(r.t for r in turns)
        end = max(r.t + (r.e2e or 0.0) for r in turns)
        durations.append(end - first)
        finish.append(end)
        for r in turns:
            model += r.e2e or 0.0
            if (r.turn or 0) > 0 or r.parent_session is not None:
                think += r.think or 0.0
            if r.ttft is not None:
                key = str(r.turn) if (r.turn or 0) < TURN_BUCKETS else f"{TURN_BUCKETS}+"
                ttft[key].append(r.ttft)
    ordered = sorted(ttft, key=lambda k: int(k.rstrip("+")))
    return SessionsSummary(
        sessions=len(by), subagents=sum(1 for t in by.values() if any(r.parent_session for r in t)),
        turns=sum(len(t) for t in by.values()), failed_turns=sum(1 for r in records if r.session and is_error(r)),
        duration_s=_dist(durations), time_to_finish_s=_dist(finish), model_time_s=model,
        think_time_s=think, ttft_by_turn={k: _dist(ttft[k]) for k in ordered},
    )


def prefix_hit_rate(stats: dict[str, float] | None) -> float | None:
    """Prefix-cache hit rate from the simulator's token counters (None without queries)."""
    if not stats:
        return None
    q = stats.get("prefix_queries_tokens") or 0.0
    return stats.get("prefix_hits_tokens", 0.0) / q if q > 0 and not math.isnan(q) else None


def counter_hit_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Prefix-cache hit rate over a run from a server's counters scraped before and after it
    (`vllm:prefix_cache_hits_total` / `queries_total`); None when the server does not export them."""
    if not before or not after:
        return None
    keys = ("prefix_cache_hits_total", "prefix_cache_queries_total")
    if any(k not in before or k not in after for k in keys):
        return None
    queries = after[keys[1]] - before[keys[1]]
    return (after[keys[0]] - before[keys[0]]) / queries if queries > 0 else None
