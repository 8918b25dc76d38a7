"""The record of one LLM request: the unit of every trace, live metric and replay result.

A `RequestRecord` holds lengths, timings and outcome — never prompt or completion text, headers,
API keys or client addresses. Times are seconds; `t` is the arrival (gateway) or intended send
time (replay) relative to the trace start. Field names are the trace format v1 (README).
"""

from __future__ import annotations

from typing import Literal

import msgspec

SCHEMA_VERSION = 1

TokensSource = Literal["usage", "chunks", "estimate"]

# The one vocabulary of failures (README "Error classes"). The gateway and the replay client record
# the same class for the same failure, so a capture and a replay of it line up; routing health
# reads the typed value. A record with `error` set is a failed request (`is_error`).
ErrorClass = Literal[
    "connect",  # the upstream refused or was unreachable: nothing was sent
    "timeout_connect",  # no connection within the connect timeout
    "timeout_ttfb",  # connected and sent, no response head within the time-to-first-byte timeout
    "timeout_idle",  # the response stopped in the middle for longer than the idle timeout
    "timeout_total",  # the whole request took longer than the total timeout
    "reset",  # the upstream closed or reset the connection before the response was complete
    "protocol",  # the upstream's response was not valid HTTP/1.1 (bad head, bad chunk framing)
    "upstream_status",  # the upstream answered with a non-2xx status
    "stream_error_event",  # an error event inside a 2xx SSE stream
    "aborted",  # the stream ended with finish_reason "error" or "abort"
    "incomplete_stream",  # a 2xx stream that ended without [DONE] or a finish_reason
    "client_disconnect",  # the client hung up before the response was complete
    "rejected",  # refused by the gateway's admission limit (429/503 with Retry-After)
    "request_too_large",  # the request body exceeded the gateway's limit (413)
    "shutdown",  # ended by the gateway's shutdown grace deadline
    "interrupted",  # replay: cancelled by Ctrl-C/SIGTERM after the drain
    "gateway_error",  # a bug inside the gateway (500)
    "unknown",  # imported traces that only say "failed"
]
ERROR_CLASSES: frozenset[str] = frozenset(ErrorClass.__args__)  # type: ignore[attr-defined]
# Names written by slogate 0.1 traces and results, read as today's classes (traces/reader.py).
LEGACY_ERRORS: dict[str, str] = {
    "upstream_connect": "connect", "upstream_error": "protocol", "stream_error": "stream_error_event",
    "http_4xx": "upstream_status", "http_5xx": "upstream_status", "timeout": "timeout_total",
    "failed": "unknown", "queue_full": "rejected", "queue_timeout": "rejected",
}


class ItlSummary(msgspec.Struct, omit_defaults=True, frozen=True, gc=False):
    """Inter-token gaps of one request: gaps between consecutive output-bearing chunks (s)."""

    count: int
    mean: float
    p50: float
    p99: float
    max: float


class RequestRecord(msgspec.Struct, omit_defaults=True, gc=False):
    """One request as measured at the gateway or by the replay client (trace format v1).

    `gc=False` (also on `ItlSummary`): a record holds no reference cycles, so the cyclic GC never
    tracks it; a million records read from a trace then cost no collector passes.
    """

    t: float
    endpoint: str = "/v1/chat/completions"
    model: str | None = None
    response_model: str | None = None  # the upstream's "model" (None: none sent, or equal not checked)
    stream: bool = True
    input_tokens: int | None = None
    input_estimated: bool = False  # input_tokens is the gateway's bytes/4 estimate (no usage was sent)
    output_tokens: int | None = None
    max_tokens: int | None = None
    tokens_source: TokensSource = "usage"
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    ttfb: float | None = None
    queue: float | None = None
    overhead: float | None = None
    itl: ItlSummary | None = None
    chunk_times: list[float] | None = None  # offsets from t of every output-bearing chunk (optional)
    status: int = 200
    finish_reason: str | None = None
    error: ErrorClass | None = None  # why the request failed (None: it did not)
    upstream: str | None = None
    pool: str | None = None
    session: str | None = None  # keyed hash of a session/user key, or an imported session id
    turn: int | None = None  # 0-based position of the request within its session
    parent_session: str | None = None  # the session that spawned this one (a subagent)
    think: float | None = None  # s from the previous turn's completion to this turn's arrival
    hash_ids: list[int] | None = None  # chained prefix-block ids (see traces.anonymize)
    block_size: int | None = None  # only when it differs from the header's
    cached_tokens: int | None = None
    n_inputs: int | None = None  # embeddings: inputs in the request
    lag: float | None = None  # replay: actual send − intended send (s); ttft/e2e count from actual send


class TraceHeader(msgspec.Struct, omit_defaults=True, tag_field="kind", tag="header"):
    """First line of every trace segment."""

    schema_version: int = SCHEMA_VERSION
    slogate_version: str = ""
    start_unix: float = 0.0  # wall-clock time of t = 0
    block_size: int = 256
    block_unit: Literal["bytes", "tokens"] = "bytes"
    tokens_source: TokensSource | None = None
    slos: dict[str, str] = {}
    config_digest: str | None = None
    salt_id: str | None = None  # identifies the salt (a keyed digest), never the salt
    source: str | None = None  # "gateway", "replay", "import:mooncake", ...
    segment: int = 0


def effective_e2e(record: RequestRecord) -> float | None:
    """E2E counted from the intended send time (coordinated omission not hidden)."""
    if record.e2e is None:
        return None
    return record.e2e + (record.lag or 0.0)


def is_error(record: RequestRecord) -> bool:
    """A failed request: non-2xx status, an error class, or a stream that ended abnormally."""
    return not (200 <= record.status < 300) or record.error is not None or record.finish_reason in ("error", "abort")


def error_class(record: RequestRecord) -> ErrorClass | None:
    """The failure class of a record (None when it succeeded), also for records that carry only a
    status or a finish reason (imported traces)."""
    if record.error is not None:
        return record.error
    if not (200 <= record.status < 300):
        return "upstream_status"
    if record.finish_reason in ("error", "abort"):
        return "aborted"
    return None
