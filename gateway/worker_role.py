"""What one worker process of a `--workers N` gateway is told by its supervisor (gateway/workers.py).

Plain data, written by the supervisor to a file the worker reads at start: its index and generation,
the shared clock base (one trace `t = 0` for all workers), where the shared routing state and its
private admin socket live. Never holds secrets, never does I/O beyond that one file.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from slogate.gateway.config import GatewayConfig, upstream_specs
from slogate.gateway.routing.shared_state import SharedRouting


class WorkerRole(msgspec.Struct, forbid_unknown_fields=True):
    index: int  # 0..N-1: the slots this worker writes in the shared state
    generation: int  # 0 for the first process of this index, +1 per restart
    workers: int  # N
    state_path: str  # the shared routing state file (gateway/routing/shared_state.py)
    admin_socket: str  # Unix socket where this worker serves its admin endpoints to the supervisor
    start_ns: int  # perf_counter_ns at the gateway's t = 0 (CLOCK_MONOTONIC: one clock for all processes)
    start_unix: float

    @property
    def trace_prefix(self) -> str:
        """Segment names unique per worker process: `slogate-w1g0-<time>-<seq>.jsonl.zst`."""
        return f"slogate-w{self.index}g{self.generation}"

    def shared(self, cfg: GatewayConfig) -> SharedRouting:
        return SharedRouting(Path(self.state_path), len(upstream_specs(cfg)), self.workers, self.index)


class WorkerStart(msgspec.Struct, forbid_unknown_fields=True):
    """The file a worker is started with: the gateway's config and its role."""

    config: GatewayConfig
    role: WorkerRole
    log_level: str = "info"
