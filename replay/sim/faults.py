"""Fault injection: per-request faults (header `x-slogate-fault` or seeded config rates), engine-wide
windows (dead, slow start, slowdown) and the test fault `leak=MB_PER_S` (`Leak`: the process really
holds that much more memory every second). Parsing and decisions only (and the leak, which has
nothing to decide); the server carries them out.

Header / --fault syntax: comma-separated `key[=value]`, e.g. `error=500`, `error_after=5`,
`reset_after=5`, `stall_ms=2000,stall_after=3`, `hang`, `delay_ms=200`. Config adds rates
(`error_rate=0.1`, `reset_rate`, `stall_rate`, `hang_rate`, `error_after_rate`, `delay_rate`) and
windows in seconds from start: `dead=10:20`, `slow_start=5`, `slowdown=30:60:3` (factor 3), and
`leak=20` (a test fault: 20 MB more resident memory per second per replica, never freed until exit).
"""

from __future__ import annotations

import asyncio
import random
import time

import msgspec

from slogate.traces.usage import UsageError

HEADER = "x-slogate-fault"


class RequestFault(msgspec.Struct, kw_only=True):
    """What goes wrong with one request."""

    error: int | None = None  # HTTP status returned before admission
    error_after: int | None = None  # error event (then [DONE]) after k tokens
    error_status: int = 500
    reset_after: int | None = None  # TCP reset after k tokens
    stall_after: int | None = None  # hold the stream after k tokens …
    stall_ms: float = 0.0  # … for this long
    hang: bool = False  # accept, never answer
    delay_ms: float = 0.0  # extra time before admission

    def any(self) -> bool:
        return self != _NONE


_NONE = RequestFault()


class FaultConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Seeded fault rates for every request plus engine-wide windows."""

    error_rate: float = 0.0
    error_status: int = 500
    error_after_rate: float = 0.0
    error_after: int = 5
    reset_rate: float = 0.0
    reset_after: int = 5
    stall_rate: float = 0.0
    stall_after: int = 3
    stall_ms: float = 2000.0
    hang_rate: float = 0.0
    delay_rate: float = 0.0
    delay_ms: float = 0.0
    dead: list[tuple[float, float]] = []  # engine dead: in-flight requests fail, new ones get 503
    slow_start_s: float = 0.0  # /health and LLM endpoints answer 503 until then
    slowdown: list[tuple[float, float, float]] = []  # (start, end, factor) step-time multiplier
    leak_mb_per_s: float = 0.0  # test fault: resident memory grows this many MB per second (Leak)
    seed: int = 0

    def sample(self, rng: random.Random) -> RequestFault | None:
        """A request's fault drawn from the rates (None: no fault)."""
        f = RequestFault()
        if self.error_rate and rng.random() < self.error_rate:
            f.error = self.error_status
        if self.error_after_rate and rng.random() < self.error_after_rate:
            f.error_after = self.error_after
        if self.reset_rate and rng.random() < self.reset_rate:
            f.reset_after = self.reset_after
        if self.stall_rate and rng.random() < self.stall_rate:
            f.stall_after, f.stall_ms = self.stall_after, self.stall_ms
        if self.hang_rate and rng.random() < self.hang_rate:
            f.hang = True
        if self.delay_ms and (self.delay_rate == 0.0 or rng.random() < self.delay_rate):
            f.delay_ms = self.delay_ms
        return f if f.any() else None

    def dead_at(self, t: float) -> float | None:
        """End of the dead window containing t (seconds since start), else None."""
        for a, b in self.dead:
            if a <= t < b:
                return b
        return None

    def slowdown_at(self, t: float) -> float:
        for a, b, factor in self.slowdown:
            if a <= t < b:
                return factor
        return 1.0


class Leak:
    """The test fault `leak=MB_PER_S`: holds `mb_per_s` more megabytes every second from `run()` on, in
    touched pages (so the resident set really grows, as a leaking server's would) until cancelled."""

    STEP_S = 0.1

    def __init__(self, mb_per_s: float) -> None:
        self.bytes_per_s = mb_per_s * 1e6
        self.held: list[bytes] = []
        self.total = 0

    def grow_to(self, elapsed_s: float) -> None:
        """Hold `elapsed_s` × the rate bytes in all (catches up after a late wake-up)."""
        missing = int(elapsed_s * self.bytes_per_s) - self.total
        if missing > 0:
            self.held.append(b"\x01" * missing)  # bytes * n writes every byte: the pages are resident
            self.total += missing

    async def run(self) -> None:
        start = time.perf_counter()
        while True:
            await asyncio.sleep(self.STEP_S)
            self.grow_to(time.perf_counter() - start)


_INT_KEYS = {"error", "error_after", "error_status", "reset_after", "stall_after"}
_FLOAT_KEYS = {"stall_ms", "delay_ms"}


def _pairs(spec: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for part in spec.split(","):
        part = part.strip()
        if part:
            k, sep, v = part.partition("=")
            out.append((k.strip().lower().replace("-", "_"), v.strip() if sep else None))
    return out


def parse_request_fault(spec: str) -> RequestFault:
    """Parse an `x-slogate-fault` header value; ValueError names the bad part."""
    f = RequestFault()
    for k, v in _pairs(spec):
        if k == "hang":
            f.hang = True
        elif k in _INT_KEYS and v is not None:
            setattr(f, k, int(v))
        elif k in _FLOAT_KEYS and v is not None:
            setattr(f, k, float(v))
        else:
            raise ValueError(f"unknown fault {k!r}{'' if v is None else '=' + v}; use error=STATUS, "
                             "error_after=K, reset_after=K, stall_ms=MS,stall_after=K, hang, delay_ms=MS")
    if f.stall_ms and f.stall_after is None:
        f.stall_after = 0
    return f


def parse_fault_config(specs: list[str], base: FaultConfig | None = None) -> FaultConfig:
    """Merge `--fault` flag values into a FaultConfig (header keys set a 100 % rate)."""
    cfg = msgspec.structs.replace(base) if base is not None else FaultConfig()
    for spec in specs:
        for k, v in _pairs(spec):
            try:
                _apply(cfg, k, v)
            except (ValueError, TypeError):
                raise UsageError(
                    f"bad --fault {k}{'' if v is None else '=' + v}; examples: error_rate=0.1, error=500, "
                    "reset_after=5, stall_ms=2000, hang_rate=0.01, dead=10:20, slow_start=5, slowdown=30:60:3, leak=20"
                ) from None
    return cfg


def _apply(cfg: FaultConfig, k: str, v: str | None) -> None:
    if k == "dead" and v:
        a, b = (float(x) for x in v.split(":"))
        cfg.dead = [*cfg.dead, (a, b)]
    elif k == "slowdown" and v:
        a, b, f = (float(x) for x in v.split(":"))
        cfg.slowdown = [*cfg.slowdown, (a, b, f)]
    elif k in ("leak", "leak_mb_per_s") and v:
        rate = float(v)
        if not rate >= 0:
            raise ValueError(k)
        cfg.leak_mb_per_s = rate
    elif k in ("slow_start", "slow_start_s") and v:
        cfg.slow_start_s = float(v)
    elif k == "error" and v:
        cfg.error_rate, cfg.error_status = 1.0, int(v)
    elif k in ("error_after", "reset_after", "stall_after") and v:
        setattr(cfg, k, int(v))
        rate = {"error_after": "error_after_rate", "reset_after": "reset_rate", "stall_after": "stall_rate"}[k]
        if getattr(cfg, rate) == 0.0:
            setattr(cfg, rate, 1.0)
    elif k == "hang":
        cfg.hang_rate = 1.0 if v is None else float(v)
    elif k in ("stall_ms", "delay_ms") and v:
        setattr(cfg, k, float(v))
        if k == "stall_ms" and cfg.stall_rate == 0.0:
            cfg.stall_rate = 1.0
    elif k == "seed" and v:
        cfg.seed = int(v)
    elif k == "error_status" and v:
        cfg.error_status = int(v)
    elif k.endswith("_rate") and k in FaultConfig.__struct_fields__ and v:
        rate = float(v)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(k)
        setattr(cfg, k, rate)
    else:
        raise ValueError(k)
