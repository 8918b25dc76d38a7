"""The simulator's /metrics: vLLM's metric names (the engine gauges and counters from
traces.engine_metrics), labels and buckets, plus prometheus_client's process metrics (resident
memory, as a real server exports them), rendered only on scrape.

The hot path bumps plain ints (`ServerStats`, `Histogram.observe`); the collector turns them
into Prometheus families when scraped. Nothing here runs per token beyond a bisect and two adds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from slogate.traces import engine_metrics as em
from slogate.traces.histogram import Histogram

# vLLM v1 buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
EMIT_LAG_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05,
                    0.1, 0.25, 1.0)


N_BUCKETS = (1, 2, 5, 10, 20)  # vllm:request_params_n


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, … up to `max_value` (vLLM's build_1_2_5_buckets, for token counts)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class ServerStats:
    """Counters and histograms of one replica, updated inline by the server."""

    def __init__(self, max_model_len: int = 8192) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)
        # per finished request, as vLLM V1's FinishedRequestStats: scheduled → first token → last token
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS)
        tokens = buckets_1_2_5(max_model_len)
        self.request_prompt = Histogram(tokens)
        self.request_generation = Histogram(tokens)
        self.params_max_tokens = Histogram(tokens)
        self.params_n = Histogram(N_BUCKETS)
        self.emit_lag = Histogram(EMIT_LAG_BUCKETS)
        self.emit_lag_max = 0.0
        self.rejected = 0


class SimCollector:
    """Renders an engine's gauges/counters and a ServerStats as vLLM-named metric families."""

    def __init__(self, model_name: str, engine_index: int, stats: ServerStats,
                 gauges: Callable[[], tuple[int, int, float, int, int, int]]) -> None:
        self.labels = [model_name, str(engine_index)]
        self.stats = stats
        self.gauges = gauges  # -> running, waiting, kv usage, preemptions, prefix queries, prefix hits

    def collect(self) -> Iterator[Metric]:
        ln = ["model_name", "engine"]
        running, waiting, usage, preempt, queries, hits = self.gauges()
        s = self.stats
        for name, doc, value in (
            (em.RUNNING[0], "Number of requests in model execution batches.", running),
            (em.WAITING[0], "Number of requests waiting to be processed.", waiting),
            (em.KV_CACHE_USAGE[0], "KV-cache usage. 1 means 100 percent usage.", usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=ln)
            g.add_metric(self.labels, value)
            yield g
        for name, doc, value in (
            (em.counter_family(em.PREEMPTIONS_TOTAL[0]), "Cumulative number of preemption from the engine.", preempt),
            (em.counter_family(em.PREFIX_CACHE_QUERIES_TOTAL[0]),
             "Prefix cache queries, in terms of number of queried tokens.", queries),
            (em.counter_family(em.PREFIX_CACHE_HITS_TOTAL[0]), "Prefix cache hits, in terms of number of cached tokens.",
             hits),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
        ):
            c = CounterMetricFamily(name, doc, labels=ln)
            c.add_metric(self.labels, value)
            yield c
        c = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                labels=[*ln, "finished_reason"])
        for reason, n in s.success.items():
            c.add_metric([*self.labels, reason], n)
        yield c
        for name, doc, h in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
             s.queue),
            ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
             s.prefill),
            ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
             s.decode),
            ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
             s.inference),
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", s.request_prompt),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.", s.request_generation),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             s.params_max_tokens),
            ("vllm:request_params_n", "Histogram of the n request parameter.", s.params_n),
            ("slogate_sim_emit_lag_seconds", "|actual − scheduled| write time of each streamed token.",
             s.emit_lag),
        ):
            fam = HistogramMetricFamily(name, doc, labels=ln)
            fam.add_metric(self.labels, h.buckets(), h.sum)
            yield fam
        c = CounterMetricFamily("slogate_sim_rejected", "Requests rejected by the bounded waiting queue.",
                                labels=ln)
        c.add_metric(self.labels, s.rejected)
        yield c


def make_registry(*collectors: object, process: bool = True) -> CollectorRegistry:
    """A registry of `collectors` plus, with `process`, `process_resident_memory_bytes` and the other
    process_* series of this process (the stability verdict's server memory)."""
    reg = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        reg.register(collector)  # type: ignore[arg-type]
    if process:
        ProcessCollector(registry=reg)
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
