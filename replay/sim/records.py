"""What a virtual run takes and gives: planned requests in, per-token results and engine stats out.

Plain msgspec records plus metric helpers from slogate.traces.metrics (so a TTFT here means what it means
in a trace); the engine fills them in. No timing logic and no I/O here.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from slogate.traces import metrics
from slogate.traces.record import ErrorClass, RequestRecord

SimError = Literal["context_length", "aborted"]
# (status, error class, finish reason) an HTTP replay of the simulator records for the same outcome of a
# streamed request: a prompt that does not fit is a 400 before the stream; a request the engine drops
# after admission gets an error event inside its 200 stream (replay.sim.stream.finish_error).
RECORD_ERRORS: dict[SimError, tuple[int, ErrorClass, str | None]] = {
    "context_length": (400, "upstream_status", None),
    "aborted": (200, "stream_error_event", "error"),
}


class SimRequest(msgspec.Struct, kw_only=True):
    """One planned request for a virtual run."""

    arrival: float  # seconds
    prompt_tokens: int
    output_tokens: int | None = None  # forced output length (ignore_eos / min_tokens)
    max_tokens: int | None = None  # cap of the seeded length when output_tokens is None
    hash_ids: list[int] | None = None  # chained prefix-block ids
    hash_block_tokens: int | None = None  # tokens per hash id (default SimConfig.hash_block_tokens)
    id: str | int | None = None


class SimResult(msgspec.Struct, kw_only=True):
    """What one request saw: every token's emission time, queueing, cache hits, preemptions."""

    index: int
    id: str | int | None
    arrival: float
    prompt_tokens: int
    output_tokens: int
    token_times: list[float]
    first_scheduled: float | None = None
    cached_tokens: int = 0
    preemptions: int = 0
    replica: int = 0
    error: SimError | None = None  # the engine's reason; to_record gives its ErrorClass

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.arrival if self.token_times else None

    @property
    def tpot(self) -> float | None:
        return metrics.tpot(self.e2e, self.ttft, len(self.token_times))

    @property
    def queue(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    def itl(self) -> list[float]:
        return metrics.gaps(self.token_times)

    def to_record(self, endpoint: str = "/v1/completions", model: str | None = None, *,
                  itl: bool = True, **fields: object) -> RequestRecord:
        """The record an HTTP replay of this request would write (`itl=False`: without its ITL summary);
        `fields`: more RequestRecord fields (replay's session and plan fields)."""
        status, error, finish = (200, None, "length") if self.error is None else RECORD_ERRORS[self.error]
        times, t = self.token_times, self.arrival
        ttft = e2e = None
        if times:  # the properties above, once each (a virtual run makes one record per request)
            ttft, e2e = times[0] - t, times[-1] - t
        return RequestRecord(  # a rejected prompt's 400 carries no usage: no input tokens, as over HTTP
            t=t, endpoint=endpoint, model=model, input_tokens=None if self.error == "context_length" else self.prompt_tokens,
            output_tokens=len(times), tokens_source="usage", ttft=ttft, tpot=metrics.tpot(e2e, ttft, len(times)),
            e2e=e2e, ttfb=ttft, queue=None if self.first_scheduled is None else self.first_scheduled - t,
            itl=metrics.itl_summary(metrics.gaps(times)) if itl else None,
            status=status, error=error, finish_reason=finish, cached_tokens=self.cached_tokens,
            **fields,  # type: ignore[arg-type]
        )


class SimStats(msgspec.Struct, kw_only=True):
    """Engine counters of a virtual run (summed over replicas)."""

    requests: int = 0
    errors: int = 0
    steps: int = 0
    host_bound_steps: int = 0  # steps whose length the host floor set (--host-step-ms …), not the GPU
    preemptions: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    busy_s: float = 0.0
    end_time: float = 0.0
    kv_blocks: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    wall_s: float = 0.0
    stopped_at: float | None = None  # run_virtual(stop_when=…) ended the run at this virtual time
    peak_running: int = 0  # most requests running at once in one replica (max_num_seqs binds when equal)


class SimRun(msgspec.Struct):
    results: list[SimResult]
    stats: SimStats
