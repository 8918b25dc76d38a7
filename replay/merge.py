"""Merging the results of a distributed replay (`--shard i/N`) into one run.

Records of every shard are put on one timeline (shards that did not share `--start-at` are
shifted by their start times) and every figure is recomputed from them: percentiles of the
merged records, never averages of shard percentiles. Drift is a maximum, so the shards' maximum
is exact; the sessions block is recomputed from the merged records. Never sends a request.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from slogate.replay import sessions
from slogate.replay.results import Results, load
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.slo import Slo, parse_slo
from slogate.traces.summary import RunSummary
from slogate.traces.usage import UsageError


class Merged(msgspec.Struct):
    results: Results
    records: list[RequestRecord]
    header: TraceHeader


def merge_dirs(dirs: list[str | Path]) -> Merged:
    from slogate.replay.finish import summarize
    from slogate.replay.outputs.records import FILE, read

    if not dirs:
        raise UsageError("give the shard result directories to merge")
    runs: list[tuple[Results, TraceHeader, list[RequestRecord]]] = []
    for d in dirs:
        p = Path(d)
        if not (p / "results.json").is_file() or not (p / FILE).is_file():
            raise UsageError(f"{d} is not a replay result directory (needs results.json and {FILE})")
        header, recs = read(p)
        runs.append((load(p), header, recs))
    digests = {r.environment.trace_digest for r, _, _ in runs}
    if len(digests) > 1:
        raise UsageError("the runs replayed different traces (trace digests differ); merge shards of one replay only")
    base = min(r.environment.start_unix for r, _, _ in runs)
    records: list[RequestRecord] = []
    for res, _, recs in runs:
        shift = res.environment.start_unix - base
        for rec in recs:
            if abs(shift) > 1e-3:
                rec.t += shift
            records.append(rec)
    records.sort(key=lambda r: r.t)
    first = runs[0][0]
    env = msgspec.structs.replace(first.environment, start_unix=base, shard=None,
                                  shards=[r.environment.shard or "?" for r, _, _ in runs],
                                  workers=sum(r.environment.workers or 0 for r, _, _ in runs) or None)
    slos: list[Slo] = [parse_slo(f"{name}:{spec}") for name, spec in env.slo.items()]
    summary = summarize(records, None, slos=slos, cost_per_hour=first.summary.cost_per_hour_usd,
                        lag_bound_s=first.summary.lag_bound_s or 0.010, open_loop=first.summary.offered_rate_rps is not None)
    _merge_drift(summary, [r.summary for r, _, _ in runs])
    summary.warmup_requests = sum(r.summary.warmup_requests for r, _, _ in runs)
    _merge_interrupted(summary, [r.summary for r, _, _ in runs])
    header = msgspec.structs.replace(runs[0][1], start_unix=base)
    results = Results(environment=env, summary=summary, point=first.point)
    results.sessions = sessions.summarize(records)  # whole sessions per shard: recomputed from all records
    return Merged(results=results, records=records, header=header)


def _merge_drift(summary: RunSummary, shards: list[RunSummary]) -> None:
    """Drift of shards (the planned lengths stay with each shard): the largest mean and worst request,
    the summed counts of requests off by more than one token and of unreachable ones."""
    for side in ("input", "output"):
        for key, combine in ((f"{side}_token_drift", max), (f"{side}_drift_worst", max), (f"{side}_drift_requests", sum)):
            values = [getattr(s, key) for s in shards if getattr(s, key) is not None]
            setattr(summary, key, combine(values) if values else None)
    unreachable = [s.unreachable_requests for s in shards if s.unreachable_requests is not None]
    summary.unreachable_requests = sum(unreachable) if unreachable else None


def _merge_interrupted(summary: RunSummary, shards: list[RunSummary]) -> None:
    """Interrupted if any shard was; the counts are sums (a shard that ran to the end sent its whole plan)."""
    if not any(s.interrupted for s in shards):
        return
    summary.interrupted = True
    for name in ("planned_requests", "sent_requests", "cancelled_requests", "not_sent_requests"):
        values = [getattr(s, name) if s.interrupted else _whole(s, name) for s in shards]
        setattr(summary, name, None if None in values else sum(values))


def _whole(shard: RunSummary, name: str) -> int | None:
    """A shard that was not interrupted: everything planned was sent, nothing cancelled."""
    sent = shard.requests + shard.warmup_requests
    return {"planned_requests": sent, "sent_requests": sent, "cancelled_requests": 0, "not_sent_requests": 0}[name]
