"""Load-balancing policies: pick one upstream among the eligible members of a group.

Each policy is O(#upstreams) plain attribute math (prefix-affinity walks a small ring); none awaits,
does I/O or sees prompt text (affinity gets only a 64-bit key). Weights divide load everywhere.
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_left
from collections.abc import Sequence

from slogate.gateway.routing.upstreams import UpstreamState

POLICIES = ("least-tokens", "least-requests", "round-robin", "power-of-two", "prefix-affinity")
VNODES = 160  # virtual nodes per unit of weight on the affinity ring


class Group:
    """The static set of upstreams one request may go to (a pool, narrowed by model), plus the
    per-group state policies keep: round-robin credit, tie-break offset, affinity ring."""

    __slots__ = ("credit", "members", "pool", "ring_keys", "ring_members", "tick")

    def __init__(self, pool: str, members: Sequence[UpstreamState]) -> None:
        self.pool = pool
        self.members = list(members)
        self.credit = dict.fromkeys(self.members, 0.0)  # smooth weighted round-robin
        self.tick = 0
        self.ring_keys: list[int] = []  # built on first use by prefix-affinity
        self.ring_members: list[UpstreamState] = []

    def build_ring(self) -> None:
        """Virtual nodes on the hash ring: VNODES per unit of weight, placed by member name."""
        ring = sorted(
            (_hash64(f"{m.name}#{v}".encode()), i)
            for i, m in enumerate(self.members)
            for v in range(max(1, round(VNODES * m.weight)))
        )
        self.ring_keys = [k for k, _ in ring]
        self.ring_members = [self.members[i] for _, i in ring]


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"slogate-ring").digest(), "little")


def prefix_key(prompt: bytes, nbytes: int = 1024) -> int | None:
    """Affinity key of a prompt: a 64-bit hash of its first `nbytes` bytes (None for no prompt)."""
    if not prompt:
        return None
    return _hash64(prompt[:nbytes])


class Policy:
    name = "policy"
    reason = "chosen"

    def choose(self, group: Group, ok: list[UpstreamState], key: int | None, tokens: int,
               now: float) -> UpstreamState:
        raise NotImplementedError


class LeastRequests(Policy):
    name = "least-requests"
    reason = "fewest in-flight requests per weight"

    def choose(self, group: Group, ok: list[UpstreamState], key: int | None, tokens: int,
               now: float) -> UpstreamState:
        n = len(ok)
        start = group.tick % n
        group.tick += 1
        best = ok[start]
        best_score = best.inflight_requests / best.weight
        for j in range(1, n):
            s = ok[(start + j) % n]
            score = s.inflight_requests / s.weight
            if score < best_score:
                best, best_score = s, score
        return best


class LeastTokens(Policy):
    """In-flight tokens per weight. With fresh scraped engine load (`scrape_stale_s` set), the
    score is corrected: (tokens + waiting · this request's tokens) · (1 + KV-cache usage)."""

    name = "least-tokens"
    reason = "fewest in-flight tokens per weight"

    def __init__(self, scrape_stale_s: float | None = None) -> None:
        self.scrape_stale_s = scrape_stale_s
        if scrape_stale_s is not None:
            self.reason = "fewest in-flight tokens per weight (corrected by scraped engine load)"

    def choose(self, group: Group, ok: list[UpstreamState], key: int | None, tokens: int,
               now: float) -> UpstreamState:
        n = len(ok)
        start = group.tick % n
        group.tick += 1
        stale = self.scrape_stale_s
        horizon = now - stale if stale is not None else math.inf
        best: UpstreamState | None = None
        best_score = math.inf
        for j in range(n):
            s = ok[(start + j) % n]
            load: float = s.inflight_tokens
            if s.scraped_at >= horizon:
                load = (load + s.scraped_waiting * tokens) * (1.0 + s.scraped_kv_usage)
            score = load / s.weight
            if score < best_score:
                best, best_score = s, score
        assert best is not None
        return best


class RoundRobin(Policy):
    """Smooth weighted round-robin (nginx): each pick adds weights to credits, takes the largest."""

    name = "round-robin"
    reason = "next in weighted round-robin"

    def choose(self, group: Group, ok: list[UpstreamState], key: int | None, tokens: int,
               now: float) -> UpstreamState:
        credit = group.credit
        total = 0.0
        best = ok[0]
        best_c = -math.inf
        for s in ok:
            c = credit[s] + s.weight
            credit[s] = c
            total += s.weight
            if c > best_c:
                best, best_c = s, c
        credit[best] -= total
        return best


class PowerOfTwo(Policy):
    """Two random members (weighted), the one with fewer in-flight tokens per weight wins."""

    name = "power-of-two"
    reason = "lighter of two random choices (in-flight tokens per weight)"

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def choose(self, group: Group, ok: list[UpstreamState], key: int | None, tokens: int,
               now: float) -> UpstreamState:
        if len(ok) == 1:
            return ok[0]
        a = self._pick(ok, None)
        b = self._pick(ok, a)
        return a if a.inflight_tokens / a.weight <= b.inflight_tokens / b.weight else b

    def _pick(self, ok: list[UpstreamState], skip: UpstreamState | None) -> UpstreamState:
        total = sum(s.weight for s in ok if s is not skip)
        r = self.rng.random() * total
        last = ok[0]
        for s in ok:
            if s is skip:
                continue
            last = s
            r -= s.weight
            if r < 0:
                return s
        return last


class PrefixAffinity(Policy):
    """Consistent hashing on the prompt's first bytes with bounded load: walk the ring from the
    key and take the first eligible member whose tokens/weight ≤ (1+ε)·the group average."""

    name = "prefix-affinity"
    reason = "owner of the prompt prefix on the hash ring"

    def __init__(self, epsilon: float = 0.25) -> None:
        self.epsilon = epsilon
        self.fallback = LeastTokens()

    def choose(self, group: Group, ok: list[UpstreamState], key: int | None, tokens: int,
               now: float) -> UpstreamState:
        if key is None or len(ok) == 1:
            return self.fallback.choose(group, ok, key, tokens, now)
        total_load = 0
        total_weight = 0.0
        for s in ok:
            total_load += s.inflight_tokens
            total_weight += s.weight
        bound = (1.0 + self.epsilon) * (total_load + tokens) / total_weight
        if not group.ring_keys:
            group.build_ring()
        keys = group.ring_keys
        ring = group.ring_members
        n = len(keys)
        i = bisect_left(keys, key)
        eligible = set(ok)
        for step in range(n):
            s = ring[(i + step) % n]
            if s in eligible and s.inflight_tokens / s.weight <= bound:
                return s
        return self.fallback.choose(group, ok, key, tokens, now)


def make_policy(name: str, *, seed: int | None = None, scrape_stale_s: float | None = None,
                epsilon: float = 0.25) -> Policy:
    if name == "least-tokens":
        return LeastTokens(scrape_stale_s)
    if name == "least-requests":
        return LeastRequests()
    if name == "round-robin":
        return RoundRobin()
    if name == "power-of-two":
        return PowerOfTwo(seed)
    if name == "prefix-affinity":
        return PrefixAffinity(epsilon)
    raise ValueError(name)
