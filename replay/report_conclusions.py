"""The report's conclusions, written by rules from the numbers: capacity at the SLO with headroom, the
operating point, the replicas for the busiest minute of the measured load and its cost (from a sweep), what
binds (from the server's telemetry), cost per million good tokens, which differences between runs are real
(replay.report_repeats), the stability verdict and where a run is not trustworthy. Each names the anchor of the figure it rests on.

Pure functions of `replay.report_model.ReportData`; never reads files and never renders HTML.
"""

from __future__ import annotations

from slogate.replay.plan.cost import replicas_for
from slogate.replay.report_model import Conclusion, ReportData, RunData, anchor, load_profile

HEADROOM = 0.9  # recommended load = this × the largest load that met the SLO
KV_FULL = 0.9  # KV-cache usage at or above this fraction counts as "the KV cache is full"
DRIFT_LIMIT = 0.05  # token drift above this (fraction) makes a run's load unlike the trace's
FAILURE_LIMIT = 0.01  # failed share above this is called out


def conclude(data: ReportData) -> list[Conclusion]:
    out: list[Conclusion] = []
    out += _capacity(data)
    out += _binding(data)
    out += _cost(data)
    out += _differences(data)
    out += _stability(data)
    out += _trust(data)
    return out


def _capacity(data: ReportData) -> list[Conclusion]:
    out = []
    for sw in data.sweeps:
        s = sw.sweep
        fig = anchor("sweep", sw.name)
        best = next((p for p in s.points if p.x == s.max_x_meeting_slo), None)
        if best is None:
            low = min((p.x for p in s.points), default=None)
            out.append(Conclusion("capacity", f"{sw.name}: misses the SLO ({s.slo or 'none given'}) at every measured "
                                  f"{s.mode}, from the lowest ({low:g}) up: the capacity is below the measured range"
                                  if low is not None else f"{sw.name}: the sweep holds no points", fig, "warn", sw.name))
            continue
        rec = best.x * HEADROOM
        # the offered load, as plan's operating point: what a replica is sent (the achieved rate trails it by
        # the requests still streaming at the window's end)
        operating = (best.offered_rate_rps or best.request_rate_rps) * HEADROOM
        rps = f" ({best.request_rate_rps:.3g} req/s)" if s.mode != "rate" else ""
        knee = f"; the knee is at {s.mode} {s.knee:g}" if s.knee is not None else ""
        values: dict[str, float | str | None] = {
            "max_meeting_slo": best.x, "recommended": rec, "mode": s.mode, "request_rate_rps": best.request_rate_rps,
            "operating_rps": operating, "knee": s.knee}
        text = (f"{sw.name}: meets the SLO ({s.slo or 'attainment'} for ≥ {s.attainment_target:.0%} of "
                f"requests) up to {s.mode} {best.x:g}{rps} of this trace; recommended ≤ {rec:.3g} "
                f"({1 - HEADROOM:.0%} headroom: operating point {operating:.3g} req/s per replica){knee}")
        text += _replicas(data, sw.path, operating, values) + _sweep_cost(data, sw.path, best.dir, values)
        out.append(Conclusion("capacity", text, fig, "info", sw.name, values))
    if not data.sweeps and data.runs:
        r = data.runs[0]
        s = r.results.summary
        att = "no SLO given" if s.slo_attainment is None else f"{s.slo_attainment:.1%} of requests met the SLO"
        out.append(Conclusion("capacity", f"{r.name}: one load point: {att} at {s.request_rate_rps:.3g} req/s; the "
                              "capacity needs a sweep (`slogate sweep … --rates …`, then report its directory)",
                              "throughput", "info", r.name,
                              {"request_rate_rps": s.request_rate_rps, "slo_attainment": s.slo_attainment}))
    return out


def in_sweep(run: RunData, sweep_path: str) -> bool:
    return run.path.startswith(sweep_path.rstrip("/") + "/")


def _replicas(data: ReportData, sweep_path: str, operating_rps: float, values: dict[str, float | str | None]) -> str:
    """Replicas for the busiest minute of the first measured run outside any sweep (the load to serve)."""
    load = next((r for r in data.runs if r.records and not any(in_sweep(r, sw.path) for sw in data.sweeps)), None)
    if load is None:
        return ""
    peak = load_profile(load.records).peak_minute_rps
    replicas = replicas_for(peak or 0.0, operating_rps)
    if peak is None or replicas is None:
        return ""
    values.update(replicas=float(replicas), peak_rps=peak, load_run=load.name)
    return (f"; {replicas} replica{'s' if replicas > 1 else ''} serve the busiest minute of {load.name}'s load "
            f"({peak:.3g} req/s) at that operating point")


def _sweep_cost(data: ReportData, sweep_path: str, point_dir: str, values: dict[str, float | str | None]) -> str:
    """The cost per million good tokens at the largest point meeting the SLO (when the sweep was priced)."""
    target = sweep_path.rstrip("/") + "/" + point_dir
    run = next((r for r in data.runs if r.path.rstrip("/") == target), None)
    good = run.results.summary.goodput_cost_per_million_output_tokens if run else None
    if run is None or good is None or run.results.summary.cost_per_hour_usd is None:
        return ""
    values.update(goodput_cost_per_million_output_tokens=good, cost_per_hour_usd=run.results.summary.cost_per_hour_usd)
    return f"; there, ${good:.3g} per million good output tokens at ${run.results.summary.cost_per_hour_usd:g}/hour"


def telemetry_peaks(run: RunData) -> dict[str, float]:
    """Max of each gauge and the increase of each counter over the scraped samples."""
    out: dict[str, float] = {}
    for name in ("running", "waiting", "kv_cache_usage", "prefix_cache_hit_rate"):
        vals = [s[name] for s in run.scraped if name in s]
        if vals:
            out[name] = max(vals)
    for name in ("preemptions_total", "prefix_cache_hits_total", "prefix_cache_queries_total"):
        vals = [s[name] for s in run.scraped if name in s]
        if vals:
            out[name] = vals[-1] - vals[0]
    return out


def peak_in_flight(run: RunData) -> int:
    """The most requests in flight at once, from the records (actual send to completion)."""
    events = []
    for r in run.records:
        send = r.t + (r.lag or 0.0)
        events += [(send, 1), (send + (r.e2e or 0.0), -1)]
    peak = cur = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at the same instant
        cur += step
        peak = max(peak, cur)
    return peak


def _binding_from_records(data: ReportData) -> list[Conclusion]:
    """No telemetry: the client's view (requests in flight vs the engine's max_num_seqs, TTFT spread)."""
    runs = [r for r in data.runs if r.records]
    if not runs:
        return [Conclusion("binding", "what binds is not determined: no server telemetry was scraped and no "
                           "per-request records (replay with --scrape-metrics 1)", "telemetry", "warn")]
    out = []
    for run in sorted(runs, key=lambda r: -r.results.summary.request_rate_rps)[:3]:
        s = run.results.summary
        seats = run.results.environment.engine.get("max_num_seqs")
        peak = peak_in_flight(run)
        p50, p99 = s.ttft_s.p50, s.ttft_s.p99
        if seats and seats.isdigit() and peak > int(seats):
            what = (f"the scheduler limit: up to {peak} requests in flight against max_num_seqs={seats}, so the rest "
                    "queued")
        elif p50 and p99 and p99 > 3 * p50:
            what = f"prefill/queueing: TTFT p99 is {p99 / p50:.1f}× its p50 with at most {peak} requests in flight"
        else:
            what = (f"nothing queued: at most {peak} requests in flight" + (f" (max_num_seqs={seats})" if seats else "")
                    + "; decode bandwidth sets TPOT")
        out.append(Conclusion("binding", f"{run.name}: what binds at {s.request_rate_rps:.3g} req/s (client view, no "
                              f"server telemetry scraped): {what}", anchor("telemetry", run.name), "info", run.name,
                              {"peak_in_flight": float(peak), "max_num_seqs": seats}))
    return out


def _binding(data: ReportData) -> list[Conclusion]:
    scraped = [r for r in data.runs if r.scraped]
    if not scraped:
        return _binding_from_records(data)
    # the most loaded run shows the limit (offered load: past the capacity the achieved rate falls)
    run = max(scraped, key=lambda r: r.results.summary.offered_rate_rps or r.results.summary.request_rate_rps)
    p = telemetry_peaks(run)
    source = TELEMETRY_SOURCES.get(run.telemetry_source or "scrape", f"from {run.telemetry_source} samples")
    env = run.results.environment
    seats = env.engine.get("max_num_seqs")
    fig = anchor("telemetry", run.name)
    kv, waiting, running = p.get("kv_cache_usage", 0.0), p.get("waiting", 0.0), p.get("running", 0.0)
    pre = p.get("preemptions_total", 0.0)
    if kv >= KV_FULL or pre > 0:
        limit = "kv_capacity"
        what = (f"KV capacity: the KV cache reached {kv:.0%}" + (f" and {pre:g} requests were preempted" if pre else ""))
    elif waiting > 0 and seats and seats.isdigit() and running >= int(seats):
        limit = "scheduler:max_num_seqs"
        what = (f"the scheduler limit: {running:g} requests ran (max_num_seqs={seats}) while up to {waiting:g} waited, "
                f"with the KV cache at most {kv:.0%}")
    elif waiting > 0:
        limit = "prefill_compute"
        what = (f"prefill compute: up to {waiting:g} requests waited while {running:g} ran"
                + (f" (below max_num_seqs={seats})" if seats else "") + f", KV cache at most {kv:.0%}")
    else:
        limit = "decode_bandwidth"
        what = (f"nothing queued: decode bandwidth (each step's weight and KV reads) sets TPOT; at most {running:g} "
                f"ran, KV cache at most {kv:.0%}, no preemptions")
    values: dict[str, float | str | None] = {k: v for k, v in p.items()}
    values.update(telemetry_source=run.telemetry_source or "scrape", limit=limit)
    return [Conclusion("binding", f"{run.name}: what binds at {run.results.summary.request_rate_rps:.3g} req/s "
                       f"({source}): {what}", fig, "info", run.name, values)]


TELEMETRY_SOURCES = {  # RunData.telemetry_source -> how a conclusion names it
    "scrape": "server telemetry scraped from /metrics during the run",
    "sim-virtual": "server telemetry from the simulated engine, sampled in virtual time",
}


def _cost(data: ReportData) -> list[Conclusion]:
    out = []
    for r in data.runs:
        s = r.results.summary
        if s.cost_per_hour_usd is None or any(in_sweep(r, sw.path) for sw in data.sweeps):
            continue  # a sweep's cost is stated at its capacity point (_capacity)
        good = s.goodput_cost_per_million_output_tokens
        text = (f"{r.name}: ${good:.4g} per million good output tokens" if good is not None
                else f"{r.name}: no good tokens, so no cost per good token")
        if s.cost_per_million_output_tokens is not None:
            text += f" (${s.cost_per_million_output_tokens:.4g} per million of all output tokens)"
        out.append(Conclusion("cost", text + f" at ${s.cost_per_hour_usd:g}/hour", "throughput", "info", r.name,
                              {"goodput_cost_per_million_output_tokens": good,
                               "cost_per_million_output_tokens": s.cost_per_million_output_tokens,
                               "cost_per_hour_usd": s.cost_per_hour_usd}))
    if not out:
        out.append(Conclusion("cost", "no price given: replay with --cost-per-hour USD for the cost per million "
                              "good tokens", "throughput", "info"))
    return out


def _differences(data: ReportData) -> list[Conclusion]:
    """Per run after the first with intervals: the headline changes beyond the noise, and those within it."""
    from slogate.replay.report_repeats import differences

    out = []
    base = data.runs[0] if data.runs else None
    for i, run in enumerate(data.runs[1:], start=1):
        if base is None or len(data.cis) < i or not data.cis[i - 1]:
            continue
        diffs = [d for d in differences(data, i) if d.significant is not None and d.relative is not None]
        real = [d for d in diffs if d.significant]
        noise = [d for d in diffs if not d.significant]
        kind = (f"over {len(run.repeats)} vs {len(base.repeats) or 1} repeats, run-to-run noise counted"
                if run.repeats or base.repeats else "per-request bootstrap, one run each")
        text = f"{run.name} vs {base.name} ({kind}): "
        if real:
            text += "real differences: " + ", ".join(
                f"{d.metric} {d.relative:+.1%}" + (f" (95 % CI {d.ci_relative[0]:+.1%} … {d.ci_relative[1]:+.1%})"
                                                   if d.ci_relative else "") for d in real)
            text += "; within the noise: " + (", ".join(d.metric for d in noise) or "none")
        else:
            text += "no difference beyond the noise (" + ", ".join(f"{d.metric} {d.relative:+.1%}" for d in noise) + ")"
        values: dict[str, float | str | None] = {f"{d.metric}.relative": d.relative for d in diffs}
        values.update({f"{d.metric}.significant": str(d.significant) for d in diffs})
        out.append(Conclusion("difference", text, "differences", "info", run.name, values))
    return out


def _stability(data: ReportData) -> list[Conclusion]:
    return [Conclusion("stability", f"{r.name}: {r.stability.verdict}", anchor("stability", r.name),
                       "info" if r.stability.stable else "warn", r.name,
                       {"stable": str(r.stability.stable), "throughput_cv": r.stability.throughput.cv})
            for r in data.runs if r.stability is not None]


def _trust(data: ReportData) -> list[Conclusion]:
    out = []
    for r in data.runs:
        s = r.results.summary
        problems = list(s.degraded_reasons) if s.degraded else []
        if s.interrupted:
            problems.append("interrupted before the schedule finished")
        for name, drift in (("input", s.input_token_drift), ("output", s.output_token_drift)):
            if drift is not None and drift > DRIFT_LIMIT:
                problems.append(f"{name} lengths drifted {drift:.1%} from the trace's")
        if s.requests and s.failed / s.requests > FAILURE_LIMIT:
            classes = ", ".join(f"{k} {v}" for k, v in sorted(s.failed_by_class.items())) or "unclassified"
            problems.append(f"{s.failed} of {s.requests} requests failed ({classes})")
        if problems:
            out.append(Conclusion("trust", f"{r.name}: not trustworthy as measured: " + "; ".join(problems),
                                  anchor("errors", r.name) if s.failed else anchor("load", r.name), "warn", r.name))
    if not out and data.runs:
        lag = max((r.results.summary.schedule_lag_s.p99 or 0.0) for r in data.runs)
        out.append(Conclusion("trust", f"no sign any run is untrustworthy: schedule lag p99 ≤ {lag * 1e3:.3g} ms, "
                              f"length drift ≤ {DRIFT_LIMIT:.0%}, failures ≤ {FAILURE_LIMIT:.0%}", "errors", "info"))
    return out
