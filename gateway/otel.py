"""OpenTelemetry export (`--otel`, extra `slogate[otel]`): one content-free span per measured request.

The span continues the request's incoming `traceparent` (and `tracestate`) with the span id the gateway
sent upstream as the engine's parent (gateway/trace_context.py), and carries the GenAI semconv attributes,
upstream, pool and outcome, with TTFT as an event; the SDK's BatchSpanProcessor exports it off the
event loop over OTLP/HTTP, configured by the standard `OTEL_*` variables. Never attaches prompt or
completion text, headers, keys or client addresses.
"""

from __future__ import annotations

from typing import Any

from slogate.gateway.live_metrics import OPERATIONS
from slogate.gateway.trace_context import TraceContext
from slogate.traces.record import RequestRecord, error_class
from slogate.traces.usage import UsageError

TTFT_EVENT = "gen_ai.server.first_token"


class OtelSpans:
    """Turns finished RequestRecords into spans on a TracerProvider (OTLP/HTTP unless one is given)."""

    def __init__(self, start_unix: float, provider_name: str, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, Status, StatusCode
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise UsageError("--otel needs the OpenTelemetry SDK: pip install 'slogate[otel]'") from None
        if tracer_provider is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES; the exporter reads
            # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT; the processor OTEL_BSP_*.
            resource = Resource.create()
            if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
                resource = resource.merge(Resource({"service.name": "slogate-gateway"}))
            tracer_provider = TracerProvider(resource=resource)
            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.ids = _PresetIds()  # the span takes the ids its request sent upstream (before the tracer is made)
        tracer_provider.id_generator = self.ids
        self.provider = tracer_provider
        self.tracer = tracer_provider.get_tracer("slogate.gateway")
        self.propagator = TraceContextTextMapPropagator()
        self.kind = SpanKind.SERVER
        self.status_error = Status(StatusCode.ERROR)
        self.start_unix = start_unix
        self.provider_name = provider_name

    def submit(self, record: RequestRecord, context: TraceContext | None = None) -> None:
        start_ns = int((self.start_unix + record.t) * 1e9)
        op = OPERATIONS.get(record.endpoint, "other")
        model = record.model or None  # None: not known (no body read, not JSON, no "model"): semconv leaves it out
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": self.provider_name,
            "http.response.status_code": record.status,
            "slogate.stream": record.stream,
        }
        for key, value in (
            ("gen_ai.request.model", model),
            ("gen_ai.response.model", record.response_model or model),
            ("gen_ai.usage.input_tokens", record.input_tokens),
            ("gen_ai.usage.output_tokens", record.output_tokens),
            ("gen_ai.request.max_tokens", record.max_tokens),
            ("gen_ai.response.finish_reasons", [record.finish_reason] if record.finish_reason else None),
            ("gen_ai.server.time_to_first_token", record.ttft),
            ("gen_ai.server.time_per_output_token", record.tpot),
            ("slogate.upstream", record.upstream),
            ("slogate.pool", record.pool),
            ("slogate.queue_seconds", record.queue),
        ):
            if value is not None:
                attrs[key] = value
        failed = error_class(record)
        attrs["slogate.outcome"] = failed or "ok"
        if failed is not None:
            attrs["error.type"] = failed
        ctx = None
        if context is not None:
            if context.parent:
                ctx = self.propagator.extract({"traceparent": context.parent, "tracestate": context.state or ""})
            if context.span_id is not None and context.trace_id is not None:
                self.ids.preset(int(context.trace_id, 16), int(context.span_id, 16))
        try:
            span = self.tracer.start_span(f"{op} {model}" if model else op, context=ctx, kind=self.kind,
                                          attributes=attrs, start_time=start_ns)
        finally:
            self.ids.preset(None, None)
        if record.ttft is not None:
            span.add_event(TTFT_EVENT, {"gen_ai.server.time_to_first_token": record.ttft},
                           timestamp=start_ns + int(record.ttft * 1e9))
        if failed is not None:
            span.set_status(self.status_error)
        e2e = record.e2e if record.e2e is not None else 0.0
        span.end(end_time=start_ns + int(e2e * 1e9))

    def start(self) -> None:
        pass

    async def close(self) -> None:
        await bounded_shutdown(self.provider.shutdown, "OTLP span")  # flushes the batch processor

    def reopen(self) -> None:
        pass


class _PresetIds:
    """The SDK's id source (an `IdGenerator`): the ids preset for the next span (those its request sent
    upstream), else random ones. The trace id is asked for only when the span has no parent."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.random = RandomIdGenerator()
        self.trace_id: int | None = None
        self.span_id: int | None = None

    def preset(self, trace_id: int | None, span_id: int | None) -> None:
        self.trace_id, self.span_id = trace_id, span_id

    def generate_span_id(self) -> int:
        return self.span_id if self.span_id is not None else self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self.trace_id if self.trace_id is not None else self.random.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return True  # preset ones come from os.urandom too (gateway/trace_context.py)


SHUTDOWN_S = 5.0  # what an exporter may take at exit to send its last batch


async def in_daemon_thread(fn: Any, name: str) -> Any:
    """`fn()` (a blocking OpenTelemetry export or shutdown) in a daemon thread; its result. With no
    collector listening an exporter retries with backoff for its whole timeout (10 s by default): in the
    loop's executor such a call held the gateway's exit far past --shutdown-grace; a daemon thread never
    holds the interpreter's exit."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def run() -> None:
        try:
            value, ok = fn(), True
        except BaseException as exc:  # handed to the awaiting coroutine
            value, ok = exc, False
        loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


async def bounded_shutdown(shutdown: Any, what: str, timeout_s: float = SHUTDOWN_S) -> None:
    """An exporter's or provider's `shutdown` (it sends what it still holds) for at most `timeout_s`."""
    import asyncio
    import logging

    try:
        await asyncio.wait_for(in_daemon_thread(shutdown, f"{what} shutdown"), timeout_s)
    except TimeoutError:
        logging.getLogger("slogate.gateway").warning(
            "%s exporter still sending after %.0f s at shutdown (no collector?): exiting without it", what, timeout_s)
