"""Live Prometheus metrics: plain counters and histograms updated once per request, rendered on scrape.

The relay never touches `prometheus_client` objects: `LiveMetrics.observe(record, …)` does a few
dict/int operations at the end of a request and `MetricsCollector` turns them into Prometheus
families only when `/metrics` is scraped. Labels follow the OTel GenAI semantic conventions
(`gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`, `gen_ai_response_model`,
`error_type`) and stay low-cardinality (unknown models fold into "other"); never request ids, paths,
client addresses or text.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from slogate import GATEWAY_BUILD, __version__
from slogate.traces.histogram import HistogramFamily
from slogate.traces.record import RequestRecord, error_class

# Explicit buckets: OTel GenAI semantic-convention advice, extended at the ends for LLM serving.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                    81.92, 163.84, 327.68)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "function_call", "content_filter", "error", "abort"})
LABEL_OTHER = "other"
REJECTED = frozenset({400, 404})  # what an upstream answers for a model it does not serve (vLLM: 404)
LABEL_NONE = "none"
# gen_ai.operation.name per OpenAI-compatible endpoint (semconv well-known values).
OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion", "/v1/embeddings": "embeddings"}
GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model")
LEGACY_LABEL = "model"


class LiveMetrics:
    """Every number `/metrics` shows, as plain Python values owned by the event loop."""

    def __init__(
        self,
        slo_names: Iterable[str],
        *,
        max_models: int = 32,
        known_models: Iterable[str] | None = None,
        provider: str = "openai",
        legacy_model_label: bool = False,
    ) -> None:
        self.max_models = max_models
        # With a known model list, anything else folds into "other"; without one, the first
        # `max_models` distinct names are kept. Either way the series count is bounded.
        self.known_models: frozenset[str] | None = frozenset(known_models) if known_models else None
        self.listed_models: frozenset[str] | None = None  # what the upstreams' /v1/models list (model_list.py)
        self._models: set[str] = set()
        self.provider = provider
        self.legacy = legacy_model_label
        m = GENAI_LABELS + ((LEGACY_LABEL,) if legacy_model_label else ())
        self.label_names = m
        self.ttft = HistogramFamily("gen_ai_server_time_to_first_token_seconds",
                                    "Time to first output token of successful streamed responses.", m, TTFT_BUCKETS)
        self.tpot = HistogramFamily("gen_ai_server_time_per_output_token_seconds",
                                    "Time per output token after the first, successful responses.", m, TPOT_BUCKETS)
        self.duration = HistogramFamily("gen_ai_server_request_duration_seconds",
                                        "Request duration to the last byte (all measured requests; error_type is "
                                        "the failure class, empty for successful requests).",
                                        (*m, "error_type"), DURATION_BUCKETS)
        self.tokens = HistogramFamily("gen_ai_client_token_usage", "Input and output tokens per request.",
                                      (*m, "gen_ai_token_type"), TOKEN_BUCKETS)
        self.itl = HistogramFamily("slogate_inter_token_latency_seconds",
                                   "Gaps between consecutive output-bearing chunks.", m, TPOT_BUCKETS)
        self.queue = HistogramFamily("slogate_queue_seconds",
                                     "Time a request waited inside the gateway before going upstream.", m, TTFT_BUCKETS)
        self.overhead = HistogramFamily("slogate_gateway_overhead_seconds",
                                        "Gateway time per request not spent waiting on the upstream or client.",
                                        ("upstream",), OVERHEAD_BUCKETS)
        self.requests: dict[tuple[str, ...], int] = {}
        self.slo_names = list(slo_names)
        self.good_requests: dict[str, int] = dict.fromkeys(self.slo_names, 0)
        # The attainment denominator per SLO: every measured request, counted in the same call as the
        # good ones, so good/judged is exactly 1 when all are good (no rate() extrapolation mismatch).
        self.slo_requests: dict[str, int] = dict.fromkeys(self.slo_names, 0)
        self.good_output_tokens: dict[str, int] = dict.fromkeys(self.slo_names, 0)
        self.output_tokens: dict[tuple[str, ...], int] = {}
        self.input_tokens: dict[tuple[str, ...], int] = {}
        self.loop_lag = 0.0
        self.histograms = (self.ttft, self.tpot, self.duration, self.tokens, self.itl, self.queue, self.overhead)

    def list_models(self, names: frozenset[str]) -> None:
        """The names the upstreams' `/v1/models` list now (gateway/model_list.py): the label candidates."""
        self.listed_models = names

    def model_label(self, model: str | None, served: bool = True) -> str:
        """`model` as a label value: names the config declares, else names the upstreams list, else
        (no list known) the first `max_models` names an upstream `served` (did not answer 400/404);
        any other is "other"."""
        if model is None:
            return LABEL_NONE
        if model in self._models:
            return model
        if self.known_models is not None:
            if model in self.known_models:
                self._models.add(model)
                return model
            return LABEL_OTHER
        allowed = served if self.listed_models is None else model in self.listed_models
        if allowed and len(self._models) < self.max_models and len(model) <= 128:
            self._models.add(model)
            return model
        return LABEL_OTHER

    def labels(self, record: RequestRecord) -> tuple[str, ...]:
        """The semconv label values of one record (plus the legacy `model` when enabled).

        gen_ai_response_model is the upstream's "model" (traces.observer reads it), the request's
        model when the upstream sent none; both fold into the same bounded model set."""
        model = self.model_label(record.model, record.status not in REJECTED)  # a rejected name takes no slot
        response = record.response_model
        answered = model if response is None or response == record.model else self.model_label(response)
        op = OPERATIONS.get(record.endpoint, LABEL_OTHER)
        if self.legacy:
            return (op, self.provider, model, answered, model)
        return (op, self.provider, model, answered)

    def observe(self, record: RequestRecord, goods: Sequence[bool], gaps: Sequence[float] | None) -> None:
        """Account one finished measured request (called once, at its end)."""
        labels = self.labels(record)
        upstream = record.upstream or LABEL_NONE
        status_class = f"{record.status // 100}xx"
        reason = record.finish_reason
        if reason is None:
            reason = "error" if record.error is not None else LABEL_NONE
        elif reason not in FINISH_REASONS:
            reason = LABEL_OTHER
        key = (*labels, upstream, status_class, reason)
        self.requests[key] = self.requests.get(key, 0) + 1
        failed_as = error_class(record)  # the one success rule (traces.record.is_error)
        failed = failed_as is not None
        if record.e2e is not None:
            self.duration.get((*labels, failed_as or "")).observe(record.e2e)
        if not failed:
            if record.ttft is not None:
                self.ttft.get(labels).observe(record.ttft)
            if record.tpot is not None:
                self.tpot.get(labels).observe(record.tpot)
            if gaps:
                h = self.itl.get(labels)
                counts, bounds = h.counts, h.bounds
                for g in gaps:
                    counts[bisect_left(bounds, g)] += 1
                h.sum += sum(gaps)
                h.count += len(gaps)
        if record.queue is not None:
            self.queue.get(labels).observe(record.queue)
        if record.overhead is not None:
            self.overhead.get((upstream,)).observe(record.overhead)
        out = record.output_tokens
        if record.input_tokens is not None:
            self.tokens.get((*labels, "input")).observe(record.input_tokens)
            self.input_tokens[labels] = self.input_tokens.get(labels, 0) + record.input_tokens
        if out is not None:
            self.tokens.get((*labels, "output")).observe(out)
            self.output_tokens[labels] = self.output_tokens.get(labels, 0) + out
        for name, good in zip(self.slo_names, goods, strict=True):
            self.slo_requests[name] += 1
            if good:
                self.good_requests[name] += 1
                self.good_output_tokens[name] += out or 0


class MetricsCollector(Collector):
    """Renders LiveMetrics, in-flight load and trace-writer counters at scrape time."""

    def __init__(
        self,
        metrics: LiveMetrics,
        inflight: Callable[[], Iterable[tuple[str, int, int]]],
        trace_counts: Callable[[], tuple[int, int] | None],
    ) -> None:
        self.m = metrics
        self.inflight = inflight
        self.trace_counts = trace_counts

    def collect(self) -> Iterable:
        m = self.m
        for h in m.histograms:
            yield h.family()
        fam = CounterMetricFamily("slogate_requests", "Measured requests by outcome.",
                                  labels=[*m.label_names, "upstream", "status_class", "finish_reason"])
        for key, n in m.requests.items():
            fam.add_metric(list(key), n)
        yield fam
        for name, doc, values in (
            ("slogate_good_requests", "Requests that met the SLO (goodput numerator).", m.good_requests),
            ("slogate_slo_requests", "Requests judged against the SLO: every measured request (attainment denominator).",
             m.slo_requests),
            ("slogate_good_output_tokens", "Output tokens of requests that met the SLO.", m.good_output_tokens),
        ):
            fam = CounterMetricFamily(name, doc, labels=["slo"])
            for slo, n in values.items():
                fam.add_metric([slo], n)
            yield fam
        for name, doc, by_labels in (
            ("slogate_output_tokens", "Output tokens of measured requests.", m.output_tokens),
            ("slogate_input_tokens", "Input (prompt) tokens of measured requests.", m.input_tokens),
        ):
            fam = CounterMetricFamily(name, doc, labels=list(m.label_names))
            for key, n in by_labels.items():
                fam.add_metric(list(key), n)
            yield fam
        reqs = GaugeMetricFamily("slogate_inflight_requests", "Requests in flight per upstream.", labels=["upstream"])
        toks = GaugeMetricFamily("slogate_inflight_tokens",
                                 "Estimated tokens in flight per upstream (prompt + remaining output).",
                                 labels=["upstream"])
        for name, n_req, n_tok in self.inflight():
            reqs.add_metric([name], n_req)
            toks.add_metric([name], n_tok)
        yield reqs
        yield toks
        counts = self.trace_counts()
        if counts is not None:
            fam = CounterMetricFamily("slogate_trace_records", "Trace records by outcome.", labels=["outcome"])
            fam.add_metric(["written"], counts[0])
            fam.add_metric(["dropped"], counts[1])
            yield fam
        yield GaugeMetricFamily("slogate_event_loop_lag_seconds",
                                "Last measured event-loop lag: wait of a ready task for the loop.", value=m.loop_lag)


def make_registry(collector: MetricsCollector) -> CollectorRegistry:
    """The gateway's registry: its own families, `process_*` (CPU, memory, fds) and build info."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    registry.register(_BuildInfo())
    return registry


class _BuildInfo(Collector):
    def collect(self) -> Iterable:
        fam = GaugeMetricFamily("slogate_build_info", "slogate version of this process, and whether its data path "
                                "runs mypyc-compiled or pure Python (value 1).", labels=["version", "build"])
        fam.add_metric([__version__, GATEWAY_BUILD], 1)
        yield fam


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


async def watch_loop_lag(metrics: LiveMetrics, interval: float) -> None:
    """Every `interval`: how long a task that is ready to run waits for the loop (one `sleep(0)`
    round trip: the callbacks and I/O queued ahead of it). Free of the 1 ms timer resolution."""
    while True:
        await asyncio.sleep(interval)
        start = time.perf_counter()
        await asyncio.sleep(0)
        metrics.loop_lag = time.perf_counter() - start
