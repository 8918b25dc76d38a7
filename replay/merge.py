"""Merging the results of a distributed replay (`--shard i/N`) into one run.

Only shards of one replay merge: the same trace and settings (target, clock, workload, SLOs, …), each
shard given once. Records of every shard are put on one timeline (real-clock shards that did not
share `--start-at` are shifted by their start times; virtual-time records already are on the trace's)
and every figure is recomputed from them with the single run's functions: percentiles of the merged
records, never averages of shard percentiles, output drift from each record's `max_tokens`. Input
drift needs the planned prompt lengths, which records do not carry: its counts are summed, its worst
request and token-weighted mean are the shards' largest (the mean an upper bound unless the shards
agree). The sessions block is recomputed from the merged records; the prefix-cache hit rate is the
shards' rates weighted by their prompt tokens (null when a shard has none). Never sends a request.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from slogate.replay import sessions
from slogate.replay.results import Results, load
from slogate.replay.workload import WorkloadError, parse_shard
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.slo import Slo, parse_slo
from slogate.traces.summary import Planned, RunSummary
from slogate.traces.usage import UsageError


class Merged(msgspec.Struct):
    results: Results
    records: list[RequestRecord]
    header: TraceHeader


class Run(msgspec.Struct):
    """One input of the merge: its directory as given, results, requests-file header and records."""

    path: str
    results: Results
    header: TraceHeader
    records: list[RequestRecord]


def merge_dirs(dirs: list[str | Path]) -> Merged:
    """The shards' result directories merged into one run (UsageError for anything but the distinct
    shards of one replay)."""
    from slogate.replay.finish import summarize

    runs = [_read(d) for d in _distinct(dirs)]
    _check_same_replay(runs)
    shards = _check_shards(runs)
    records = _timeline(runs)
    first = runs[0].results
    base = min(r.results.environment.start_unix for r in runs)
    env = msgspec.structs.replace(first.environment, start_unix=base, shard=None, shards=shards,
                                  workers=sum(r.results.environment.workers or 0 for r in runs) or None)
    slos: list[Slo] = [parse_slo(f"{name}:{spec}") for name, spec in env.slo.items()]
    planned = [Planned(None, rec.max_tokens) for rec in records]  # the single run's output plan (finish.collect)
    summary = summarize(records, planned, slos=slos, cost_per_hour=first.summary.cost_per_hour_usd,
                        lag_bound_s=first.summary.lag_bound_s or 0.010, open_loop=first.summary.offered_rate_rps is not None)
    shard_summaries = [r.results.summary for r in runs]
    _merge_input_drift(summary, shard_summaries)
    summary.warmup_requests = sum(s.warmup_requests for s in shard_summaries)
    _merge_interrupted(summary, shard_summaries)
    header = msgspec.structs.replace(runs[0].header, start_unix=base)
    results = Results(environment=env, summary=summary, point=first.point)
    results.sessions = sessions.summarize(records)  # whole sessions per shard: recomputed from all records
    if results.sessions is not None:  # planned but never sent: only the shards knew their plans
        results.sessions.unsent_turns = sum(r.results.sessions.unsent_turns for r in runs if r.results.sessions)
    results.prefix_cache_hit_rate = _merge_hit_rate([r.results for r in runs])
    return Merged(results=results, records=records, header=header)


def _distinct(dirs: list[str | Path]) -> list[str | Path]:
    """The directories, refusing one given twice (by any spelling of its path)."""
    if not dirs:
        raise UsageError("give the shard result directories to merge")
    seen: dict[Path, str | Path] = {}
    for d in dirs:
        key = Path(d).resolve()
        if key in seen:
            also = "" if str(seen[key]) == str(d) else f" (as {seen[key]} and {d})"
            raise UsageError(f"{d} is given twice{also}; give each shard directory once")
        seen[key] = d
    return dirs


def _read(d: str | Path) -> Run:
    from slogate.replay.outputs.records import FILE, read

    p = Path(d)
    if not (p / "results.json").is_file() or not (p / FILE).is_file():
        raise UsageError(f"{d} is not a replay result directory (needs results.json and {FILE})")
    header, recs = read(p)
    return Run(path=str(d), results=load(p), header=header, records=recs)


def _settings(res: Results) -> list[tuple[str, str, object]]:
    """What every shard of one replay shares, as (what the error names, the option that sets it, value);
    the workload without the run's own shard."""
    env, s = res.environment, res.summary
    return [
        ("trace digest", "TRACE", env.trace_digest), ("clock", "clock (all --virtual or none)", env.clock),
        ("target", "--target", env.target), ("models", "--target", sorted(env.models)),
        ("workload", "--speed/--rate/--window/--max-requests/…", [w for w in env.workload if not w.startswith("shard=")]),
        ("SLOs", "--slo", env.slo), ("seed", "--seed", env.seed), ("endpoint", "--endpoint", env.endpoint),
        ("streaming", "streaming (all --no-stream or none)", env.stream), ("output forcing", "--force-output", env.output_forcing),
        ("prompt tokens", "--prompt-tokens", env.prompt_tokens), ("request timeout", "--timeout", env.request_timeout_s),
        ("retries", "--retries", env.retries), ("cost per hour", "--cost-per-hour", s.cost_per_hour_usd),
        ("lag bound", "--lag-bound", s.lag_bound_s),
    ]


def _check_same_replay(runs: list[Run]) -> None:
    """Refuse runs that cannot be shards of one replay, naming the first setting that differs."""
    first = _settings(runs[0].results)
    for run in runs[1:]:
        for (name, option, a), (_, _, b) in zip(first, _settings(run.results), strict=True):
            if a != b:
                raise UsageError(f"{runs[0].path} and {run.path} are not shards of one replay (different {name}: "
                                 f"{a!r} vs {b!r}); merge runs made with the same {option}")


def _covers(res: Results) -> list[str]:
    """The shard specs a run holds: its own `--shard`, or those a merged run combined ([] = the whole replay)."""
    env = res.environment
    specs = [env.shard] if env.shard else list(env.shards)
    return [] if "?" in specs else specs


def _check_shards(runs: list[Run]) -> list[str]:
    """The merged run's shard specs (in shard order), refusing a shard given twice, shards of different
    splits (I/N with another N) and, next to anything else, a run that is no shard (it holds every request)."""
    if len(runs) == 1:
        return _covers(runs[0].results) or ["?"]
    owner: dict[str, str] = {}
    split: tuple[int, str] | None = None
    for run in runs:
        specs = _covers(run.results)
        if not specs:
            raise UsageError(f"{run.path} is not a shard (made without --shard, it holds every request of the "
                             "replay); merge the --shard I/N runs of one replay")
        for spec in specs:
            if spec in owner:
                raise UsageError(f"{owner[spec]} and {run.path} both hold shard {spec} (the same run twice?); "
                                 "give each shard of the replay once")
            n = _shard_count(spec, run.path)
            if split is not None and n != split[0]:
                raise UsageError(f"{split[1]} and {run.path} split the replay differently (--shard …/{split[0]} vs "
                                 f"{spec}); merge the shards of one --shard I/N replay")
            split = split or (n, run.path)
            owner[spec] = run.path
    return sorted(owner, key=lambda spec: parse_shard(spec)[0])


def _shard_count(spec: str, path: str) -> int:
    try:
        return parse_shard(spec)[1]
    except WorkloadError:
        raise UsageError(f"{path}/results.json has a bad shard {spec!r}; expected I/N, e.g. 0/3") from None


def _timeline(runs: list[Run]) -> list[RequestRecord]:
    """Every record on one timeline, in intended-time order. Virtual-time records already are on the
    trace's timeline; real-clock records count from their own run's start, so a shard that started
    later (no shared `--start-at`) is shifted by the difference of the wall-clock starts."""
    base = min(r.results.environment.start_unix for r in runs)
    records: list[RequestRecord] = []
    for run in runs:
        env = run.results.environment
        shift = 0.0 if env.clock == "virtual" else env.start_unix - base
        for rec in run.records:
            if abs(shift) > 1e-3:
                rec.t += shift
            records.append(rec)
    records.sort(key=lambda r: r.t)
    return records


def _merge_input_drift(summary: RunSummary, shards: list[RunSummary]) -> None:
    """Input drift of the shards (records do not carry the planned prompt lengths, so it cannot be
    recomputed): the summed counts of requests off by more than one token and of unreachable ones, the
    worst request, and the largest token-weighted mean (exact when the shards agree, else an upper bound)."""
    for key, combine in (("input_token_drift", max), ("input_drift_worst", max), ("input_drift_requests", sum),
                         ("unreachable_requests", sum)):
        values = [getattr(s, key) for s in shards if getattr(s, key) is not None]
        setattr(summary, key, combine(values) if values else None)


def _merge_hit_rate(shards: list[Results]) -> float | None:
    """The shards' prefix-cache hit rates weighted by their prompt tokens (the counters' queries are
    prompt tokens, which records do not carry per shard); None unless every shard has one."""
    rates = [(r.prefix_cache_hit_rate, r.summary.input_tokens or 0) for r in shards]
    if any(rate is None for rate, _ in rates):
        return None
    total = sum(w for _, w in rates)
    if total <= 0:
        return sum(rate for rate, _ in rates if rate is not None) / len(rates)
    return sum(rate * w for rate, w in rates if rate is not None) / total


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
