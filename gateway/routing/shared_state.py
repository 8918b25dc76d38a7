"""Routing state shared by the worker processes of one `--workers N` gateway: one memory-mapped file.

Each worker writes only its own slots (in-flight requests and tokens per upstream, admission queue
depth); readers sum the N slots, so least-tokens and the admission limit see the whole gateway.
Passive ejection is one slot per upstream (last writer wins); so are the active health verdict and
the scraped engine load, which only worker 0 writes (it alone probes the upstreams, as Envoy's main
thread does for its workers). The admission check-and-claim is
atomic under an `flock` (released by the kernel when a holder is killed). Never does I/O per request
beyond that lock, never holds request data.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
from pathlib import Path

from slogate.gateway.routing.upstreams import UpstreamSpec, UpstreamState

_INT = 8  # bytes per slot (signed 64-bit ints, one float64 per upstream for the ejection deadline)


class SharedLayout:
    """Where each slot lives. Ints: requests[u][w], tokens[u][w], queue_depth[w], unhealthy[u]; floats:
    ejected_until[u], then the scraped engine load: waiting[u], kv_usage[u], scraped_at[u] (0: never)."""

    def __init__(self, n_upstreams: int, n_workers: int) -> None:
        self.n_upstreams = n_upstreams
        self.n_workers = n_workers
        self.req = 0
        self.tok = n_upstreams * n_workers
        self.queue = 2 * n_upstreams * n_workers
        self.unhealthy = self.queue + n_workers  # 0: healthy (a zeroed file starts every upstream in service)
        self.ints = self.unhealthy + n_upstreams
        self.waiting, self.kv_usage, self.scraped_at = n_upstreams, 2 * n_upstreams, 3 * n_upstreams
        self.size = (self.ints + 4 * n_upstreams) * _INT


def create(path: Path, n_upstreams: int, n_workers: int) -> None:
    """The supervisor's part: a zeroed state file (and the lock file next to it)."""
    layout = SharedLayout(n_upstreams, n_workers)
    with open(path, "wb") as f:
        f.write(bytes(layout.size))
    lock_path(path).touch()


def lock_path(path: Path) -> Path:
    return path.with_suffix(".lock")


class SharedRouting:
    """One process's view of the state file; `worker` is the index whose slots it writes."""

    def __init__(self, path: Path, n_upstreams: int, n_workers: int, worker: int) -> None:
        self.layout = layout = SharedLayout(n_upstreams, n_workers)
        self.worker = worker
        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, layout.size)
        finally:
            os.close(fd)
        view = memoryview(self._mm)
        self.ints = view[: layout.ints * _INT].cast("q")
        self.floats = view[layout.ints * _INT:].cast("d")
        self._lock_fd = os.open(lock_path(path), os.O_RDWR)  # per process: flock is per open file
        self._claim = _Claim(self._lock_fd)

    def claim(self) -> _Claim:
        """`with shared.claim():` holds the gateway-wide admission lock (check room and take a lease atomically)."""
        return self._claim

    def states(self, specs: list[UpstreamSpec], *, max_requests: int | None,
               max_tokens: int | None) -> list[UpstreamState]:
        return [SharedUpstreamState(s, i, self, max_requests=max_requests, max_tokens=max_tokens)
                for i, s in enumerate(specs)]

    # ---- the supervisor's side
    def worker_inflight(self, worker: int) -> int:
        """Requests the worker had in flight (read after it died: the streams it lost)."""
        lay = self.layout
        return sum(self.ints[lay.req + u * lay.n_workers + worker] for u in range(lay.n_upstreams))

    def worker_queued(self, worker: int) -> int:
        """Requests the worker had waiting in its admission queues (read after it died: lost too)."""
        return self.ints[self.layout.queue + worker]

    def clear_worker(self, worker: int) -> None:
        """Zero a dead worker's slots before its replacement starts."""
        lay = self.layout
        for u in range(lay.n_upstreams):
            self.ints[lay.req + u * lay.n_workers + worker] = 0
            self.ints[lay.tok + u * lay.n_workers + worker] = 0
        self.ints[lay.queue + worker] = 0

    def queue_depth(self) -> int:
        lay = self.layout
        return sum(self.ints[lay.queue: lay.queue + lay.n_workers])

    def set_queue_depth(self, depth: int) -> None:
        self.ints[self.layout.queue + self.worker] = depth

    @property
    def runs_probes(self) -> bool:
        """One worker runs the health checks and metric scrapes for all (worker 0, or its replacement)."""
        return self.worker == 0


class _Claim:
    """The lock as a reusable context manager (no generator per request)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class SharedUpstreamState(UpstreamState):
    """An `UpstreamState` whose in-flight counts, ejection deadline, health verdict and scraped load are
    gateway-wide.

    Reading `inflight_requests` sums every worker's slot and remembers the sum; writing it adds
    (value written - sum read) to this worker's slot. `Lease`'s `+=`/`-=` (a read then a write, with
    no await between on one event loop) thus move only this worker's share, never another's."""

    __slots__ = ("_at", "_eject", "_floats", "_health", "_ints", "_kv", "_live", "_own_req", "_own_tok", "_req",
                 "_seen_req", "_seen_tok", "_tok", "_waiting")

    def __init__(self, spec: UpstreamSpec, index: int, shared: SharedRouting, **limits: int | None) -> None:
        lay = shared.layout
        self._ints = shared.ints
        self._floats = shared.floats
        n = lay.n_workers
        self._req = slice(lay.req + index * n, lay.req + (index + 1) * n)
        self._tok = slice(lay.tok + index * n, lay.tok + (index + 1) * n)
        self._own_req = lay.req + index * n + shared.worker
        self._own_tok = lay.tok + index * n + shared.worker
        self._seen_req = self._seen_tok = 0  # the base __init__ "sets 0": a zero delta
        self._eject = index
        self._health = lay.unhealthy + index
        self._waiting, self._kv, self._at = lay.waiting + index, lay.kv_usage + index, lay.scraped_at + index
        self._live = False  # the base __init__'s defaults must not overwrite the gateway's verdicts:
        super().__init__(spec, index, **limits)  # a restarted worker keeps the ejection and health
        self._live = True

    @property  # type: ignore[override]
    def inflight_requests(self) -> int:
        self._seen_req = v = sum(self._ints[self._req])
        return v

    @inflight_requests.setter
    def inflight_requests(self, value: int) -> None:
        self._ints[self._own_req] += value - self._seen_req
        self._seen_req = value

    @property  # type: ignore[override]
    def inflight_tokens(self) -> int:
        self._seen_tok = v = sum(self._ints[self._tok])
        return v

    @inflight_tokens.setter
    def inflight_tokens(self, value: int) -> None:
        self._ints[self._own_tok] += value - self._seen_tok
        self._seen_tok = value

    @property  # type: ignore[override]
    def ejected_until(self) -> float:
        return self._floats[self._eject]

    @ejected_until.setter
    def ejected_until(self, value: float) -> None:
        if self._live:
            self._floats[self._eject] = value

    @property  # type: ignore[override]
    def healthy(self) -> bool:
        return not self._ints[self._health]

    @healthy.setter
    def healthy(self, value: bool) -> None:
        if self._live:
            self._ints[self._health] = 0 if value else 1

    # The scraped load: three slots written one after another by the scraper; a reader between two
    # writes mixes two scrapes of one upstream, which the router takes as the estimate it is.
    @property  # type: ignore[override]
    def scraped_waiting(self) -> float:
        return self._floats[self._waiting]

    @scraped_waiting.setter
    def scraped_waiting(self, value: float) -> None:
        if self._live:
            self._floats[self._waiting] = value

    @property  # type: ignore[override]
    def scraped_kv_usage(self) -> float:
        return self._floats[self._kv]

    @scraped_kv_usage.setter
    def scraped_kv_usage(self, value: float) -> None:
        if self._live:
            self._floats[self._kv] = value

    @property  # type: ignore[override]
    def scraped_at(self) -> float:
        """Monotonic seconds (one clock for every process of the host); -inf when never scraped."""
        at = self._floats[self._at]
        return at if at > 0 else -math.inf

    @scraped_at.setter
    def scraped_at(self, value: float) -> None:
        if self._live and value > 0:
            self._floats[self._at] = value
