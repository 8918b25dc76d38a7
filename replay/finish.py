"""From what the workers sent back to a run's results: records in order, warmup removed, the summary.

Pure functions of per-request records (shared by `replay.run` and `replay.merge`, so a merged run
is computed exactly like a single one). Never does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from slogate import __version__
from slogate.replay import measure
from slogate.replay.interrupt import INTERRUPTED_ERROR
from slogate.replay.results import Environment, Results
from slogate.replay.worker import Item
from slogate.replay.workload import Workload
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.slo import Slo
from slogate.traces.summary import Planned, RunSummary, Window, offered_window, run_window
from slogate.traces.summary import summarize as summarize_records


def window(records: Sequence[RequestRecord], *, open_loop: bool) -> Window:
    """The summary's throughput window: the offered window open loop (the same for every candidate
    replaying the schedule); closed loop (no schedule): first send to last completion."""
    return offered_window(records) if open_loop else run_window(records)


def summarize(records: list[RequestRecord], planned: list[Planned] | None, *,
              slos: Sequence[Slo], cost_per_hour: float | None, lag_bound_s: float, open_loop: bool,
              input_floor: int | None = None) -> RunSummary:
    """RunSummary of measured records, with the run-level measurements (also used by merge); rates
    over `window`."""
    summary = summarize_records(records, window=window(records, open_loop=open_loop), slos=slos, planned=planned,
                                input_floor=input_floor, offered_rate_rps=measure.offered_rate(records) if open_loop else None,
                                cost_per_hour_usd=cost_per_hour)
    summary.send_rate_rps = measure.send_rate(records)
    summary.lag_bound_s = lag_bound_s
    reasons = measure.degraded_reasons(records, lag_bound_s=lag_bound_s, open_loop=open_loop)
    summary.degraded, summary.degraded_reasons = bool(reasons), reasons
    return summary


def collect(items: list[Item], workload: Workload, env: Environment, *, slos: Sequence[Slo],
            cost_per_hour: float | None, lag_bound_s: float) -> tuple[Results, list[RequestRecord], TraceHeader]:
    """Results, measured records (intended-time order, warmup excluded) and the requests-file header."""
    items.sort(key=lambda it: (it.record.t, it.index))
    measured = [it for it in items if not it.warmup]
    records = [it.record for it in measured]
    planned = [Planned(_as_counted(it.input_tokens, env), it.record.max_tokens) for it in measured]
    summary = summarize(records, planned, slos=slos, cost_per_hour=cost_per_hour, lag_bound_s=lag_bound_s,
                        open_loop=not workload.concurrency, input_floor=input_floor(env))
    summary.warmup_requests = len(items) - len(measured)
    header = TraceHeader(slogate_version=__version__, start_unix=env.start_unix, block_size=workload.block_size,
                         block_unit="tokens", tokens_source=None, slos=env.slo, source="replay")
    return Results(environment=env, summary=summary), records, header


def _as_counted(planned: int | None, env: Environment) -> int | None:
    """A planned prompt length as the server's prompt_tokens counts it: `content` plans leave out what the
    target adds (BOS, chat template); unknown, there is no input drift to report."""
    if planned is None or env.prompt_tokens != "content":
        return planned
    return None if env.prompt_added_tokens is None else planned + env.prompt_added_tokens


def input_floor(env: Environment) -> int | None:
    """The fewest prompt tokens the target can be sent: the tokens its template adds around any prompt."""
    return env.prompt_base_tokens


def mark_interrupted(summary: RunSummary, items: list[Item], *, planned: int | None) -> None:
    """An interrupted run's summary: planned vs sent vs cancelled (every sent request is an item)."""
    summary.interrupted = True
    summary.planned_requests = planned
    summary.sent_requests = len(items)
    summary.cancelled_requests = sum(it.record.error == INTERRUPTED_ERROR for it in items)
    summary.not_sent_requests = None if planned is None else max(planned - len(items), 0)
