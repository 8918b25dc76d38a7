"""Record: where one finished request goes — live metrics, the status window, the trace capture and
the optional sinks (access log, OpenTelemetry spans).

Called once per measured request, at its end, from the event loop: computes SLO goodness once,
then does plain increments, a non-blocking queue put and the sinks' buffer appends. Never does I/O
or hashing itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from slogate.gateway.capture import Capture
from slogate.gateway.live_metrics import LiveMetrics
from slogate.gateway.status import StatusWindow
from slogate.gateway.trace_context import TraceContext
from slogate.traces.metrics import gaps as chunk_gaps
from slogate.traces.record import RequestRecord
from slogate.traces.slo import Slo, is_good


class Sink(Protocol):
    """Gets every finished record (and the request's trace context, if any); buffers, never blocks."""

    def submit(self, record: RequestRecord, context: TraceContext | None = None) -> None: ...
    def start(self) -> None: ...
    async def close(self) -> None: ...
    def reopen(self) -> None: ...


class Recorder:
    __slots__ = ("capture", "metrics", "sinks", "slos", "start_ns", "status", "tokens")

    def __init__(
        self,
        slos: Sequence[Slo],
        metrics: LiveMetrics,
        status: StatusWindow,
        capture: Capture | None,
        start_ns: int,
        sinks: Sequence[Sink] = (),
    ) -> None:
        self.sinks = tuple(sinks)
        self.slos = tuple(slos)
        self.metrics = metrics
        self.status = status
        self.capture = capture
        self.start_ns = start_ns
        self.tokens: Any = None  # gateway.tokens.GatewayTokens when a tokenizer is configured

    def finish(self, record: RequestRecord, body: Any, context: TraceContext | None = None,
               session_header: str | None = None) -> None:
        goods = [is_good(record, slo) for slo in self.slos]
        chunk_times = record.chunk_times
        gaps = None
        if chunk_times is not None and len(chunk_times) > 1:
            gaps = chunk_gaps(chunk_times)
        self.metrics.observe(record, goods, gaps)
        self.status.add(record)
        for sink in self.sinks:
            sink.submit(record, context)
        if self.capture is not None:
            self.capture.submit(record, body, session_header)
        else:
            record.chunk_times = None

    def trace_counts(self) -> tuple[int, int]:
        return self.capture.counts() if self.capture is not None else (0, 0)
