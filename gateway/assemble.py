"""Record assembly: the observer's measured fields plus what the gateway knows of the request → one
`RequestRecord`, handed to the Recorder.

Runs once per measured request, after its response ended (or never started); never on the
per-chunk path, never raises into the relay (a failing recorder is logged, the request goes on).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import perf_counter_ns
from typing import Any

from slogate.gateway.headers import RequestFields
from slogate.gateway.recorder import Recorder
from slogate.gateway.trace_context import TraceContext
from slogate.traces.observer import StreamObserver
from slogate.traces.record import ErrorClass, RequestRecord
from slogate.traces.request_info import RequestInfo

log = logging.getLogger("slogate.gateway")

NS = 1e-9
_CLIENT_SIDE: frozenset[ErrorClass] = frozenset({"client_disconnect", "shutdown"})


def measured(obs: StreamObserver, t_done: int, status: int, error: ErrorClass | None) -> RequestRecord:
    """The observer's record; a client that hangs up (or a shutdown) after [DONE] / the finish chunk
    got the whole answer, so those classes only replace `incomplete_stream`."""
    if error in _CLIENT_SIDE and obs.stream:
        record = obs.finish(t_done, status=status)
        if record.error == "incomplete_stream":
            record.error = error
        return record
    return obs.finish(t_done, status=status, error=error)


def with_request(record: RequestRecord, info: RequestInfo, t0_ns: int, start_ns: int) -> RequestRecord:
    """Arrival time and the request's own fields."""
    record.t = (t0_ns - start_ns) * NS
    record.model = info.model
    record.stream = info.stream
    record.max_tokens = info.max_tokens
    return record


def exchange_record(obs: StreamObserver, info: RequestInfo, *, t0_ns: int, start_ns: int, t_done: int, status: int,
                    error: ErrorClass | None, upstream: str, pool: str | None, queue: float | None,
                    overhead_ns: int, answered_stream: bool | None = None) -> RequestRecord:
    """The record of a request that went to an upstream. `answered_stream`: whether the upstream's 2xx
    answer was an event stream (None: no 2xx answer), which is what `stream` records (a request
    saying `"stream": "yes"` may still be streamed)."""
    record = with_request(measured(obs, t_done, status, error), info, t0_ns, start_ns)
    if answered_stream is not None:
        record.stream = answered_stream
    if record.input_tokens is None and info.prompt_chars:
        # no usage (llama.cpp streams, failed requests): bytes/4 keeps the request replayable
        record.input_tokens = info.est_input_tokens
        record.input_estimated = True
    if record.n_inputs is None:
        record.n_inputs = info.n_inputs
    record.upstream = upstream
    record.pool = pool
    record.queue = queue
    record.overhead = overhead_ns * NS
    return record


def unsent_record(info: RequestInfo, *, t0_ns: int, start_ns: int, t_end: int, status: int, error: ErrorClass,
                  pool: str | None, queue: float | None) -> RequestRecord:
    """A measured request that never reached an upstream (admission 429, or the client left the queue)."""
    obs = StreamObserver(t0_ns, stream=False, endpoint=info.endpoint)
    record = with_request(obs.finish(t_end, status=status, error=error), info, t0_ns, start_ns)
    record.pool = pool
    record.queue = queue
    return record


def too_large_detail(limit: int, length: int) -> str:
    """The 413 `request_too_large` message's detail; `length` as announced, -1 when the body grew past it."""
    return f"limit {limit} bytes" + (f", got {length}" if length >= 0 else "")


def record_too_large(recorder: Recorder, *, t0_ns: int, start_ns: int, endpoint: str) -> None:
    """A measured request answered 413 before its body was read (so nothing of it is known but its path)."""
    obs = StreamObserver(t0_ns, stream=False, endpoint=endpoint)
    record = obs.finish(perf_counter_ns(), status=413, error="request_too_large")
    record.t = (t0_ns - start_ns) * NS
    hand_off(recorder, record, None)


def hand_off(recorder: Recorder, record: RequestRecord, parsed: Any,
             headers: RequestFields | Mapping[str, str] | None = None, sent_ids: tuple[str, str] | None = None) -> None:
    """To live metrics, the status window, the capture and the sinks; metrics must never break the relay.
    An estimated prompt goes through the tokenizer queue first (gateway.tokens), when one is configured.
    From the request `headers` only `traceparent`, `tracestate` and the `--session-header` value are taken;
    `sent_ids`: the (trace, span) ids the gateway sent upstream as the request's parent span (--otel)."""
    try:
        context = session = None
        if headers is not None:
            parent = headers.get("traceparent")
            if parent is not None or sent_ids is not None:
                context = TraceContext(parent, headers.get("tracestate"), *(sent_ids or (None, None)))
            name = recorder.capture.session_header if recorder.capture is not None else None
            session = headers.get(name) if name else None
        if recorder.tokens is not None and record.input_estimated and parsed is not None:
            recorder.tokens.submit(record, parsed, lambda rec, body: recorder.finish(rec, body, context, session))
            return
        recorder.finish(record, parsed, context, session)
    except Exception:
        log.exception("recording a request failed")
