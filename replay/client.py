"""Sends one planned request and times its response with the shared `traces` StreamObserver.

One connection pool per worker (`replay.http`, keep-alive, unlimited concurrency). Timing starts
at the *actual* send; `record.lag` = actual − intended. Never raises for a failed request (the
record says what went wrong) and never writes API keys or headers anywhere.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Sequence
from typing import cast

import msgspec

from slogate.replay.http import HttpError, Pool
from slogate.replay.interrupt import INTERRUPTED_ERROR, INTERRUPTED_STATUS
from slogate.traces.observer import StreamObserver
from slogate.traces.record import ERROR_CLASSES, ErrorClass, RequestRecord

RETRY_STATUSES = frozenset({429, 502, 503})
# replay.http raises these kinds (HttpError.kind); their error class, the one the gateway records for
# the same failure. One small table so the codec can switch to ErrorClass names later.
HTTP_ERRORS: dict[str, ErrorClass] = {"connect": "connect", "reset": "reset", "timeout": "timeout_total"}


def error_class(exc: HttpError, obs: StreamObserver) -> ErrorClass:
    """The class of a transport failure; the request timeout is `timeout_ttfb` when no byte arrived."""
    kind = exc.kind
    found = HTTP_ERRORS.get(kind)
    if found is None:
        return cast(ErrorClass, kind) if kind in ERROR_CLASSES else "reset"
    if found == "timeout_total" and not obs.got_bytes:
        return "timeout_ttfb"
    return found


class ClientConfig(msgspec.Struct, frozen=True):
    base_url: str
    model: str | None = None
    endpoint: str = "/v1/chat/completions"
    stream: bool = True
    headers: dict[str, str] = {}  # may hold the API key: kept in memory only
    timeout_s: float = 600.0
    retries: int = 0  # retries before any response byte (connect error, 429/502/503)
    retry_backoff_s: float = 0.5  # first delay, doubled per retry, jittered ×[0.5, 1.5); Retry-After wins when longer
    keep_chunk_times: bool = True
    session_header: str | None = None  # header carrying a session's opaque per-run id (replay.sessions.header_value)
    session_nonce: str = ""  # per run: the same trace replayed twice gives different session ids


def retry_delay(cfg: ClientConfig, attempt: int, retry_after: str | None, rng: random.Random | None = None) -> float:
    """Seconds before retry number `attempt` (1-based): jittered exponential back-off, but never less than
    the server's `Retry-After` (seconds or an HTTP date; spread ×[1, 1.1) so clients do not return in step),
    capped at the request timeout."""
    uniform = (rng or random).uniform
    delay = cfg.retry_backoff_s * (2 ** (attempt - 1)) * uniform(0.5, 1.5)
    wait = parse_retry_after(retry_after)
    if wait is not None:
        delay = max(delay, wait * uniform(1.0, 1.1))
    return min(delay, cfg.timeout_s)


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def new_pool(cfg: ClientConfig) -> Pool:
    return Pool(cfg.base_url, cfg.headers)


class InFlight:
    """A request whose send happened in `start` (synchronously, at the pacer's instant)."""

    __slots__ = ("attempt", "body", "endpoint", "extra", "intended_ns", "obs", "pending", "t_send")

    def __init__(self, pool: Pool, cfg: ClientConfig, body: bytes, intended_ns: int, endpoint: str, stream: bool,
                 extra: Sequence[tuple[str, str]] = ()):
        self.t_send = time.perf_counter_ns()
        self.intended_ns, self.body, self.endpoint, self.attempt, self.extra = intended_ns, body, endpoint, 0, extra
        self.obs = StreamObserver(self.t_send, stream=stream, endpoint=endpoint, keep_chunk_times=cfg.keep_chunk_times)
        self.pending = pool.begin(endpoint, body, self.obs.feed, extra)


def start(pool: Pool, cfg: ClientConfig, body: bytes, *, intended_ns: int, endpoint: str | None = None,
          stream: bool | None = None, extra: Sequence[tuple[str, str]] = ()) -> InFlight:
    """Send now (when a kept-alive connection is idle, the bytes are written before this returns);
    `extra`: headers of this request only."""
    return InFlight(pool, cfg, body, intended_ns, endpoint or cfg.endpoint, cfg.stream if stream is None else stream,
                    extra)


async def complete(pool: Pool, cfg: ClientConfig, f: InFlight) -> RequestRecord:
    """Wait for the response of `start`; retries per the config; the record of what happened."""
    while True:
        status, error = 0, None
        try:
            status = await pool.finish(f.pending, timeout_s=cfg.timeout_s)
        except HttpError as exc:
            error = error_class(exc, f.obs)
        if f.attempt < cfg.retries and (error == "connect" or status in RETRY_STATUSES):
            f.attempt += 1
            await asyncio.sleep(retry_delay(cfg, f.attempt, f.pending.retry_after))
            f.obs = StreamObserver(f.t_send, stream=f.obs.stream, endpoint=f.endpoint,
                                   keep_chunk_times=cfg.keep_chunk_times)
            f.pending = pool.begin(f.endpoint, f.body, f.obs.feed, f.extra)
            continue
        return _record(cfg, f, status, error)


def interrupted(cfg: ClientConfig, f: InFlight) -> RequestRecord:
    """The record of a request cancelled by an interrupted run (Ctrl-C): what arrived until now, marked
    failed with status 499 and error "interrupted"; its connection was closed by the cancellation."""
    return _record(cfg, f, INTERRUPTED_STATUS, INTERRUPTED_ERROR)


def _record(cfg: ClientConfig, f: InFlight, status: int, error: ErrorClass | None) -> RequestRecord:
    record = f.obs.finish(time.perf_counter_ns(), status=status, error=error)
    record.lag = (f.t_send - f.intended_ns) * 1e-9
    record.model = cfg.model
    if record.chunk_times:
        record.chunk_times = [round(c, 6) for c in record.chunk_times]
    return record

