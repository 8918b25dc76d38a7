"""One replay run: target → calibration → paced sending (in-process or worker processes) → Results.

`run_replay(workload, options)` orchestrates; sending happens in `replay.worker`, prompt text in
`replay.prompts`, numbers in `replay.results`/`replay.measure`, Ctrl-C in `replay.interrupt` (a
live run interrupted while sending still returns its results). Never writes files except the
scrape series (outputs are `replay.outputs`); never records the API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import msgspec

from slogate import __version__
from slogate.replay import finish, measure
from slogate.replay.client import ClientConfig
from slogate.replay.forcing import Forcing, choose
from slogate.replay.interrupt import Interrupt, Interrupted
from slogate.replay.prompts import (
    WORDS,
    PromptPlan,
    calibrate,
    content_added_tokens,
    content_convention,
    verify,
)
from slogate.replay.redact import redact
from slogate.replay.results import Environment, Results
from slogate.replay.sessions import SESSION_HEADER
from slogate.replay.target import Probe, apply_probe, check_model, parse_target, probe, start_sim
from slogate.replay.tokenizers import FileTokenizer, TokenCounter, UsageCounter, probe_server_tokenizer
from slogate.replay.worker import Item, WorkerSpec, run_share
from slogate.replay.workload import Workload, mean_rate, split_for_workers
from slogate.traces.metrics import Summary
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.slo import Slo
from slogate.traces.usage import UsageError

if TYPE_CHECKING:
    from slogate.replay.sim.records import SimResult

RATE_PER_WORKER = 500.0  # requests/s one sender process is given above the single-process range
SINGLE_WORKER_MAX_RPS = 200.0
TOKENS_PER_WORKER = 6000.0  # streamed output tokens/s one sender process parses while holding ~1 ms lag


class ReplayOptions(msgspec.Struct, kw_only=True):
    target: str
    model: str | None = None
    endpoint: str = "chat"  # chat | completions
    stream: bool = True
    headers: dict[str, str] = {}
    api_key: str | None = None  # sent as a bearer token; never written anywhere
    timeout_s: float = 600.0
    retries: int = 0
    retry_backoff_s: float = 0.5
    force_output: str = "auto"
    tokenizer: str | None = None  # None = auto (server /tokenize, else calibrate), "calibrate", "none", FILE
    workers: int | None = None  # None = auto
    virtual: bool = False
    slos: list[Slo] = []
    cost_per_hour: float | None = None
    lag_bound_s: float = measure.LAG_BOUND_S
    seed: int = 0
    labels: dict[str, str] = {}
    scrape_interval_s: float | None = None
    out_dir: str | None = None  # where metrics.jsonl goes when scraping
    start_at: float | None = None  # shared wall-clock start (distributed replay)
    shard: str | None = None
    progress: bool = False
    progress_interval_s: float | None = None  # plain stderr lines this often instead of rich (not a TTY)
    stability_window_s: float | None = None  # --stability: the progress lines show the current window
    command: list[str] = []
    trace: str | None = None
    trace_digest: str | None = None
    keep_chunk_times: bool = True
    # virtual runs without chunk times: still keep them for the requests the throughput window cuts
    # (streaming at its end), so every rate and token count is the one with them (slogate plan's
    # points); the summary's ITL distribution stays empty and records carry no ITL summary
    window_chunk_times: bool = False
    stop_on_error: bool = False  # session timing: a failed turn ends its session (--on-turn-error stop)
    prompt_tokens: str = "server"  # server: prompt_tokens on the server (template included) | content: message content
    calibrate: bool = True  # False (--no-calibrate): no calibration chats; needs a tokenizer
    drain_timeout_s: float = 5.0  # after Ctrl-C/SIGTERM: how long requests in flight may finish before cancel
    session_header: str | None = SESSION_HEADER  # header naming each session (an opaque per-run id), None: off


class RunOutput(msgspec.Struct):
    results: Results
    records: list[RequestRecord]  # measured requests (warmup excluded), in intended-time order
    header: TraceHeader
    client_cpu_s: float = 0.0
    sim_stats: dict[str, float] | None = None
    signal: int | None = None  # the signal that interrupted the run (results.summary.interrupted)


def endpoint_path(name: str) -> str:
    if name in ("chat", "/v1/chat/completions"):
        return "/v1/chat/completions"
    if name in ("completions", "/v1/completions"):
        return "/v1/completions"
    raise UsageError(f"bad --endpoint {name!r}: use chat or completions")


def auto_workers(workload: Workload) -> int:
    if workload.concurrency:
        return 1 if workload.concurrency <= 512 else min(os.cpu_count() or 1, math.ceil(workload.concurrency / 512))
    rate = mean_rate(workload.requests) or 0.0
    reqs = workload.requests
    tokens_rate = rate * sum(r.output_tokens for r in reqs) / len(reqs) if reqs else 0.0
    by_rate = 1 if rate < SINGLE_WORKER_MAX_RPS else math.ceil(rate / RATE_PER_WORKER)
    by_tokens = math.ceil(tokens_rate / TOKENS_PER_WORKER) if tokens_rate > TOKENS_PER_WORKER else 1
    return max(1, min(os.cpu_count() or 1, max(by_rate, by_tokens)))


def replay(workload: Workload, options: ReplayOptions) -> RunOutput:
    """Synchronous entry point (uvloop when available)."""
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run(run_replay(workload, options))
    return asyncio.run(run_replay(workload, options))


async def run_replay(workload: Workload, options: ReplayOptions) -> RunOutput:
    """Run `workload` against `options.target` and summarize it (records + Results)."""
    if not workload.requests:
        raise UsageError("the workload is empty: check --window/--sample/--max-requests/--duration")
    path = endpoint_path(options.endpoint)
    if options.virtual:
        return _run_virtual(workload, options, path)
    interrupt = Interrupt(options.drain_timeout_s)
    try:
        with interrupt.installed():
            return await _run_live(workload, options, path, interrupt)
    except asyncio.CancelledError:
        if interrupt.signum is None or interrupt.sending_began:
            raise
        raise Interrupted(interrupt.signum) from None


def replay_virtual(workload: Workload, options: ReplayOptions, *,
                   stop_when: Callable[[SimResult, float], bool] | None = None) -> RunOutput:
    """`replay` in virtual time with the sim's early stop (`slogate plan`'s capacity search)."""
    if not workload.requests:
        raise UsageError("the workload is empty: check --window/--sample/--max-requests/--duration")
    return _run_virtual(workload, options, endpoint_path(options.endpoint), stop_when=stop_when)


def _run_virtual(workload: Workload, options: ReplayOptions, path: str,
                 stop_when: Callable[[SimResult, float], bool] | None = None) -> RunOutput:
    from slogate.replay.sim.gcpace import paused

    with paused():  # all it allocates stays alive to the end: collections would find nothing
        return _virtual(workload, options, path, stop_when)


def _virtual(workload: Workload, options: ReplayOptions, path: str,
             stop_when: Callable[[SimResult, float], bool] | None) -> RunOutput:
    spec = parse_target(options.target)
    if spec.sim is None:
        raise UsageError("--virtual needs a simulated target: --target sim:GPU/MODEL")
    from slogate.replay.virtual import run_virtual
    from slogate.replay.virtual_samples import VirtualSamples

    t_wall = time.time()
    samples = VirtualSamples(options.scrape_interval_s or 1.0) if options.out_dir else None  # the sim's telemetry
    items, stats = run_virtual(workload, spec.sim, endpoint=path, model=options.model or spec.sim.get("model"),
                               stop_on_error=options.stop_on_error, stop_when=stop_when, probe=samples,
                               keep_chunk_times=options.keep_chunk_times,
                               window_chunk_times=options.window_chunk_times)
    if samples is not None and options.out_dir:
        samples.write(Path(options.out_dir) / "metrics.jsonl")
    env = _environment(options, workload, Probe(models=[spec.sim.get("model", "")], kind="slogate-sim"),
                       Forcing("exact (virtual)"), "virtual", t_wall, workers=0)
    env.clock = "virtual"
    out = _output(items, workload, options, env, cpu=0.0, sim_stats=stats)
    if options.window_chunk_times and not options.keep_chunk_times:
        out.results.summary.itl_s = Summary()  # pooled from the window's edge requests alone it would be no figure
    return out


async def _run_live(workload: Workload, options: ReplayOptions, path: str, interrupt: Interrupt) -> RunOutput:
    """Real-clock run over HTTP: one URL, several replicas (comma-separated), or a sim started here."""
    if "," in options.target and not options.target.startswith("sim:"):
        urls = [parse_target(t.strip()).url for t in options.target.split(",") if t.strip()]
        return await _run_http(workload, options, urls[0], path, started=False, interrupt=interrupt,
                               replicas=[u for u in urls if u])
    spec = parse_target(options.target)
    if spec.sim is not None:
        async with start_sim(spec.sim) as url:
            return await _run_http(workload, options, url, path, started=True, interrupt=interrupt)
    assert spec.url is not None
    return await _run_http(workload, options, spec.url, path, started=False, interrupt=interrupt)


async def _run_http(workload: Workload, options: ReplayOptions, url: str, path: str, *, started: bool,
                    interrupt: Interrupt, replicas: list[str] | None = None) -> RunOutput:
    """HTTP run; with several `replicas` (comma-separated --target) worker i sends to replica i mod n."""
    headers = dict(options.headers)
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        info = await probe(session, url, headers, wait_s=15.0 if started else 0.0)
        model = options.model or (info.models[0] if info.models else None)
        warning = check_model(options.model, info.models, url)
        if warning:
            print(f"slogate replay: {warning}", file=sys.stderr, flush=True)
        traffic: dict[str, int] = {}
        chat = path.endswith("chat/completions")
        plan, counter = await _prompt_plan(session, url, model, headers, options, workload, chat=chat, traffic=traffic)
        checked = None
        if counter is not None and not isinstance(counter, UsageCounter):  # servers without usage: lengths checked here
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, UsageError):
                checked = await verify(counter, plan, workload.requests, chat=chat,
                                       content=options.prompt_tokens == "content")
    forcing = choose(options.force_output, info.kind)
    workers = options.workers or auto_workers(workload)
    client = ClientConfig(base_url=url, model=model, endpoint=path, stream=options.stream, headers=headers,
                          timeout_s=options.timeout_s, retries=options.retries,
                          retry_backoff_s=options.retry_backoff_s, keep_chunk_times=options.keep_chunk_times,
                          session_header=options.session_header, session_nonce=os.urandom(8).hex())
    wspec = WorkerSpec(client=client, plan=plan, forcing=forcing, duration_s=workload.duration_s,
                       stop_on_error=options.stop_on_error)
    items: list[Item] = []
    progress = None
    if options.progress:
        from slogate.replay.progress import Progress
        from slogate.replay.stability import LiveWindow

        window = LiveWindow(options.stability_window_s) if options.stability_window_s else None
        progress = Progress(len(workload.requests), [r.t for r in workload.requests], options.slos[0] if options.slos else None,
                            window)

    def on_items(batch: list[Item]) -> None:
        items.extend(batch)
        if progress is not None:
            progress.add([it.record for it in batch])

    def start_at() -> float:
        if options.start_at is None:
            return time.perf_counter() + 0.05
        from slogate.replay.pacer import start_from_wall_clock

        start = start_from_wall_clock(options.start_at)
        if start < time.perf_counter() - 1.0:
            raise UsageError(f"--start-at {options.start_at:.0f} is in the past: give a UNIX time a few seconds "
                             "ahead, e.g. $(( $(date +%s) + 30 ))")
        return start

    t_wall_now, t_mono_now = time.time(), time.perf_counter()
    side: list[asyncio.Task] = []
    side_session = aiohttp.ClientSession()
    cpu0 = time.process_time()

    def start_side(start: float) -> None:
        if options.scrape_interval_s and options.out_dir:
            from slogate.replay.scrape import scrape

            Path(options.out_dir).mkdir(parents=True, exist_ok=True)
            side.append(asyncio.create_task(scrape(side_session, url, headers, interval_s=options.scrape_interval_s,
                                                   start=start, path=Path(options.out_dir) / "metrics.jsonl")))
        if progress is not None:
            side.append(asyncio.create_task(progress.run(start, options.progress_interval_s)))

    from slogate.replay.scrape import fetch

    counters_before = await fetch(side_session, url, headers)  # prefix-cache counters, when exported
    interrupt.sending_began = True
    try:
        # Rich redraws stay off the sender's loop (pool path); a plain line every N s is cheap enough to share it.
        inline_ok = progress is None or options.progress_interval_s is not None
        if workers == 1 and inline_ok and not (replicas and len(replicas) > 1):
            start = start_at()
            start_side(start)
            wspec.concurrency = workload.concurrency
            await run_share(wspec, workload.requests, start, on_items, interrupt.stop)
            cpu = time.process_time() - cpu0
        else:
            from slogate.replay.pool import run_pool

            shares, wspecs = _shares(workload, workers, wspec)
            if replicas and len(replicas) > 1:
                wspecs = [msgspec.structs.replace(ws, client=msgspec.structs.replace(ws.client, base_url=replicas[i % len(replicas)]))
                          for i, ws in enumerate(wspecs)]
            def start_and_side() -> float:
                s = start_at()
                start_side(s)
                return s

            start, cpu = await run_pool(wspecs, shares, start_and_side, on_items, interrupt.stop)
    finally:
        for task in side:
            task.cancel()
        for task in side:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        counters_after = await fetch(side_session, url, headers) if counters_before else None
        await side_session.close()
    start_wall = t_wall_now + (start - t_mono_now)
    env = _environment(options, workload, info, forcing, plan.tokenizer + ("" if plan.exact else " (inexact)"),
                       start_wall, workers=workers)
    env.models = info.models
    env.prompt_base_tokens = plan.base_tokens if plan.tokenizer != "none" else None
    env.prompt_tokens = options.prompt_tokens
    env.prompt_added_tokens = plan.added_tokens
    env.warmup_traffic = {k: v for k, v in sorted(traffic.items()) if v}
    if checked is not None:
        env.prompt_lengths_checked = f"{checked[0]} of {checked[1]} exact on {plan.tokenizer}"
    out = _output(items, workload, options, env, cpu=cpu, signum=interrupt.signum)
    if not (replicas and len(replicas) > 1):  # one server's counters cover the whole run
        from slogate.replay.sessions import counter_hit_rate

        out.results.prefix_cache_hit_rate = counter_hit_rate(counters_before, counters_after)
    return out


def _shares(workload: Workload, workers: int, wspec: WorkerSpec) -> tuple[list, list[WorkerSpec]]:
    """Round-robin schedule split; a closed loop's C is split as evenly as possible."""
    shares = split_for_workers(workload.requests, workers)
    if not workload.concurrency:
        return shares, [wspec] * workers
    c = workload.concurrency
    specs = [msgspec.structs.replace(wspec, concurrency=c // workers + (i < c % workers)) for i in range(workers)]
    keep = [i for i, s in enumerate(specs) if s.concurrency]
    return [shares[i] for i in keep], [specs[i] for i in keep]


async def _prompt_plan(session: aiohttp.ClientSession, url: str, model: str | None, headers: dict[str, str],
                       options: ReplayOptions, workload: Workload, *, chat: bool,
                       traffic: dict[str, int]) -> tuple[PromptPlan, TokenCounter | None]:
    """The prompt plan and its counter; every request it sends to the target is counted in `traffic` by kind."""
    choice = options.tokenizer
    usage = UsageCounter(session, url, model, headers)
    usage.traffic = traffic
    if not options.calibrate and choice in (None, "auto", "calibrate", "none"):
        raise UsageError("--no-calibrate needs a tokenizer: --tokenizer FILE (tokenizer.json) or --tokenizer server")
    if options.prompt_tokens not in ("server", "content"):
        raise UsageError(f"bad --prompt-tokens {options.prompt_tokens!r}: use server or content")
    content = options.prompt_tokens == "content"
    if choice == "none":
        return PromptPlan(vocab=list(WORDS), base_tokens=0, seed=options.seed, block_size=workload.block_size,
                          tokenizer="none", exact=False), None
    if choice in (None, "server", "auto"):
        counter = await probe_server_tokenizer(session, url, model, headers, traffic)
        if counter is None and choice == "server":
            raise UsageError(f"{url} has no /tokenize endpoint: use --tokenizer calibrate or --tokenizer FILE")
        counter = counter or usage
    elif choice == "calibrate":
        counter = usage
    else:
        if not os.path.exists(choice):
            raise UsageError(f"no such tokenizer file: {choice} (or use --tokenizer server|calibrate|none)")
        counter = FileTokenizer(choice)
    # the template is measured when lengths count it (server): by calibration chats, or without sending one
    # on a /tokenize that applies templates (--no-calibrate); a template left unmeasured makes the plan inexact
    template = chat and not content
    fallback = None if isinstance(counter, UsageCounter) or not options.calibrate else _ChatFallback(counter, usage)
    try:
        # a local file counts the words as the target does; what the target adds (its BOS) is measured on it
        server = usage if isinstance(counter, FileTokenizer) and options.calibrate and not chat else None
        plan = await calibrate(counter, chat=template, seed=options.seed, block_size=workload.block_size,
                               chat_counter=fallback, server_counter=server)
        if server is not None and isinstance(counter, FileTokenizer):  # from now on it counts as the target does
            counter.added = plan.base_tokens - await counter.count(plan.anchor)
        if content:  # what the server will count on top of each plan: the honest input drift needs it
            # on the counter alone: a chat template is counted only where that sends no chat (a /tokenize that
            # applies templates; usage when calibrating by usage anyway), so `content` still sends no chat to calibrate
            added = await content_added_tokens(counter, plan, chat=(True if options.calibrate else None) if chat else False)
            return content_convention(plan, added), counter
        return plan, counter
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise UsageError(f"prompt calibration against {url} failed: {exc}") from None


class _ChatFallback:
    """Chat overhead from the counter when it knows templates, else from usage.prompt_tokens."""

    def __init__(self, counter, usage: UsageCounter):
        self.counter, self.usage, self.name = counter, usage, counter.name

    async def count(self, text: str) -> int:
        return await self.counter.count(text)

    async def count_chat(self, text: str) -> int | None:
        n = await self.counter.count_chat(text)
        return n if n is not None else await self.usage.count_chat(text)


def _environment(options: ReplayOptions, workload: Workload, info: Probe, forcing: Forcing, tokenizer: str,
                 start_wall: float, *, workers: int) -> Environment:
    return apply_probe(Environment(
        target=options.target, models=info.models, server_version=info.server_version, labels=dict(options.labels),
        trace=options.trace, trace_digest=options.trace_digest, seed=options.seed, command=redact(options.command),
        slogate_version=__version__, start_unix=start_wall, endpoint=endpoint_path(options.endpoint),
        stream=options.stream, output_forcing=forcing.mode, tokenizer=tokenizer,
        slo={s.name: s.spec() for s in options.slos}, shard=options.shard, server_kind=info.kind,
        workload=[workload.source, *workload.description], request_timeout_s=options.timeout_s,
        retries=options.retries, workers=workers,
    ), info, options.target)


def _output(items: list[Item], workload: Workload, options: ReplayOptions, env: Environment, *, cpu: float,
            sim_stats: dict[str, float] | None = None, signum: int | None = None) -> RunOutput:
    results, records, header = finish.collect(items, workload, env, slos=options.slos, cost_per_hour=options.cost_per_hour,
                                              lag_bound_s=options.lag_bound_s)
    if signum is not None:
        finish.mark_interrupted(results.summary, items, planned=_planned(workload))
    from slogate.replay import sessions

    results.sessions = sessions.summarize(records)
    if results.sessions is not None and signum is None:  # interrupted: not_sent_requests says it
        results.sessions.unsent_turns = max(len(workload.requests) - len(items), 0)
    results.prefix_cache_hit_rate = sessions.prefix_hit_rate(sim_stats)
    return RunOutput(results=results, records=records, header=header, client_cpu_s=cpu, sim_stats=sim_stats,
                     signal=signum)


def _planned(workload: Workload) -> int | None:
    """Requests the schedule held (warmup included); None for a closed loop cycling until --duration."""
    return None if workload.concurrency and workload.duration_s is not None else len(workload.requests)
