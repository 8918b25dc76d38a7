"""`slogate replay`: replay a trace (or a synthetic workload) against a target and write the results.

Parses options into a `Workload` (replay.source / replay.profiles + replay.workload transforms)
and `ReplayOptions` (`plan`), runs `replay.run` and writes `replay.outputs` (`run_and_write`, also
used in memory by `slogate sweep` and the demo). User mistakes raise `UsageError`
(one line, exit 2); an interrupted run writes its results, then exits 130 (SIGINT) / 143 (SIGTERM).
This module holds no measurement logic.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from slogate.replay import workload as wl
from slogate.replay.cli.args import Parser, output_dir, pairs, seconds
from slogate.replay.sessions import SESSION_HEADER
from slogate.traces.usage import UsageError

if TYPE_CHECKING:
    from slogate.replay.run import ReplayOptions, RunOutput
    from slogate.traces.summary import RunSummary

EXAMPLES = """examples:
  # 10 minutes of a production trace at 10x speed against a vLLM server
  slogate replay trace.jsonl.zst --window 0:600 --speed 10 --target http://gpu-box:8000 \\
      --model meta-llama/Llama-3.1-8B-Instruct --slo ttft=0.5,tpot=50ms --label gpu=H100 --out runs/h100
  # a public trace rescaled to 20 req/s, against a simulated H100 (HTTP) or in virtual time
  slogate replay traces/samples/azure_conv_10min.csv --rate 20 --target sim:h100-sxm/llama-3-8b --out runs/sim
  slogate replay traces/samples/mooncake_conversation_10min.jsonl --target 'sim:a100-80g/llama-3-8b?max_model_len=131072' --virtual
  # agentic sessions (one file each): think time after each answer, subagents beside their parent
  slogate replay traces/samples/agentic/*.json --target 'sim:h200/llama-3.1-70b?tp=4' --virtual
  # synthetic: Poisson 5 req/s for 2 min; bursty gamma; closed loop with 32 in flight
  slogate replay --synthetic poisson:rate=5 --duration 2m --input-tokens lognormal:median=1000,sigma=0.7 \\
      --output-tokens fixed:200 --target http://localhost:8000 --out runs/poisson
  slogate replay --synthetic gamma:rate=5,cv=3 --target http://localhost:8000
  slogate replay --synthetic concurrency:c=32 --max-requests 2000 --target http://localhost:8000
  # distributed: 3 machines, each every 3rd request, all starting at the same wall-clock second
  slogate replay trace.csv --shard 0/3 --start-at $(( $(date +%s) + 30 )) --target http://lb:8000 --out shard0
  slogate merge shard0 shard1 shard2 -o merged

interrupting a run (Ctrl-C or SIGTERM):
  no new request is sent; requests in flight get --drain-timeout (default 5s) to finish, then are
  cancelled (recorded with status 499, error "interrupted"); a second Ctrl-C cancels them at once.
  The results are written as usual, with summary.interrupted = true and planned/sent/cancelled/not-sent
  counts. Exit status 130 (SIGINT) or 143 (SIGTERM). --virtual runs are not interruptible this way.
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="slogate replay", description="Replay a trace or a synthetic workload against an "
                                "OpenAI-compatible server (or the simulator) with faithful arrival times, prompt "
                                "lengths and prefix sharing; report throughput, goodput and latency.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("trace", nargs="*", help="trace file: slogate (.jsonl.zst or capture dir), Mooncake .jsonl[.gz], Azure/BurstGPT "
      ".csv; or agentic session files (.json, several or a directory: concurrent sessions)")
    a("--format", dest="fmt", help="trace format when it cannot be guessed: slogate, mooncake, azure, burstgpt, agentic")
    a("--block-size", type=int, help="tokens per hash id of the trace (Mooncake files cut in 16/64-token blocks; default 512)")
    a("--config", metavar="run.toml", help="TOML file with a [replay] table of these options (flags override it)")
    a("--target", help="http://HOST:PORT, or sim:GPU/MODEL[?tp=4&dtype=fp8&timing=constant&…] "
      "(default $OPENAI_BASE_URL without its /v1)")
    a("--model", help="model name to send (default: the first of the target's /v1/models)")
    a("--out", help="output directory (default ./slogate-replay-YYYYmmdd-HHMMSS)")
    a("--repeat", type=int, default=1, metavar="N", help="run the same replay N times (OUT/run-1 … run-N) and report "
      "each metric's run-to-run spread (OUT/repeats.json); compare such runs with `slogate compare --repeat N`")
    g = p.add_argument_group("workload")
    g.add_argument("--synthetic", help="poisson:rate=R | gamma:rate=R,cv=C (or burstiness=B) | constant:rate=R | concurrency:c=N | "
                   "agentic:sessions=N,turns=T,think=S,growth=TOKENS,subagents=P,system=TOKENS,rate=R (sessions/s)")
    g.add_argument("--input-tokens", default="lognormal:median=512,sigma=0.6", help="synthetic prompt lengths: fixed:N, uniform:A,B, lognormal:median=N,sigma=S, empirical:TRACE")
    g.add_argument("--output-tokens", default="lognormal:median=128,sigma=0.6", help="synthetic output lengths (same forms)")
    g.add_argument("--concurrency", type=int, help="closed loop: keep C requests in flight (trace lengths, times ignored)")
    g.add_argument("--window", help="START:END seconds of the trace (e.g. 0:600, 10m:20m)")
    g.add_argument("--speed", type=float, help="time compression (2 = twice as fast)")
    g.add_argument("--rate", type=float, help="rescale arrival times to this mean rate (req/s)")
    g.add_argument("--sample", type=float, help="keep this fraction of requests (seeded)")
    g.add_argument("--max-requests", type=int, help="at most N requests")
    g.add_argument("--duration", help="stop after this long (30s, 5m); with --loop the trace repeats to fill it")
    g.add_argument("--loop", action="store_true", help="repeat the trace (fresh prompts per repeat) until --duration")
    g.add_argument("--warmup", help="N requests, or a time like 30s, sent first and excluded from statistics")
    g.add_argument("--seed", type=int, default=0, help="seed of every random choice (sampling, prompt text, synthetic)")
    g.add_argument("--session-timing", choices=["think", "recorded"], help="think (default when the trace has "
                   "sessions): turn k+1 is sent its think time after turn k completed on the target; recorded: at "
                   "its recorded time")
    g.add_argument("--session-start", default="recorded", help="when sessions start (think timing): recorded (their "
                   "offsets), all (at once), stagger:SECONDS, poisson:rate=R (seeded)")
    g.add_argument("--on-turn-error", default="continue", choices=["stop", "continue"],
                   help="think timing: a failed turn ends its session (stop) or the next turn is still sent (continue)")
    g.add_argument("--session-header", default=SESSION_HEADER, metavar="NAME|off",
                   help="header carrying each session's opaque id on its requests (default X-Session-Id: a "
                   "gateway with --session-header X-Session-Id captures the sessions again); off: none")
    g.add_argument("--shard", help="I/N: send every N-th request starting at I (distributed replay)")
    g.add_argument("--start-at", type=float, help="UNIX time at which the schedule starts (all shards agree)")
    r = p.add_argument_group("requests")
    r.add_argument("--endpoint", default="chat", choices=["chat", "completions"], help="API endpoint (default chat)")
    r.add_argument("--no-stream", action="store_true", help="non-streaming requests (TTFT undefined)")
    r.add_argument("--header", action="append", default=[], help="extra header K:V (repeatable)")
    r.add_argument("--api-key", default=os.environ.get("SLOGATE_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (or $SLOGATE_API_KEY, then $OPENAI_API_KEY); never written")
    r.add_argument("--timeout", default="600", help="per-request timeout (default 600s)")
    r.add_argument("--retries", type=int, default=0, help="retries before any response byte (connect error, 429/502/503)")
    r.add_argument("--retry-backoff", default="0.5", help="first retry delay, doubled each retry, jittered; "
                   "a longer Retry-After from the server wins")
    r.add_argument("--force-output", default="auto", help="auto | ignore_eos | min_tokens | logit-bias:JSON | none")
    r.add_argument("--tokenizer", help="auto (default: server /tokenize, else calibrate) | server | calibrate | none | FILE (tokenizer.json)")
    t = p.add_argument_group("prompt lengths (issue 20)")
    t.add_argument("--prompt-tokens", default="server", choices=["server", "content"],
                   help="what a prompt length counts: server = the server's prompt_tokens, chat template included "
                        "(default); content = tokens of the message content, as AIPerf, guidellm and vllm bench count")
    t.add_argument("--no-calibrate", action="store_true", help="send no calibration chats before the run (needs "
                   "--tokenizer FILE or server; with --prompt-tokens server the template is then not counted)")
    s = p.add_argument_group("sending and results")
    s.add_argument("--workers", type=int, help="sender processes (default auto: 1 below 200 req/s)")
    s.add_argument("--virtual", action="store_true", help="sim target only: run in virtual time, no HTTP")
    s.add_argument("--lag-bound", default="10ms", help="schedule-lag p99 above this marks the run degraded")
    s.add_argument("--slo", action="append", default=[], help="[NAME:]ttft=0.5,tpot=50ms,e2e=30 — NAME: is optional "
                   "(ttft=0.5 alone works); repeatable, the first drives goodput")
    s.add_argument("--cost-per-hour", type=float, help="USD/hour of the whole setup → cost per 1M tokens and per 1k requests")
    s.add_argument("--label", action="append", default=[], help="K=V environment label (repeatable): gpu=H100")
    s.add_argument("--scrape-metrics", nargs="?", const="1", help="sample the target's /metrics every N s (default 1) into DIR/metrics.jsonl; "
                   "--virtual runs always write the simulated engine's state there (every N virtual s, default 1)")
    s.add_argument("--stability", metavar="WINDOW", help="long-run stability: per-WINDOW (1m, 30s) throughput, goodput, "
                   "p99 TTFT and errors, their CV and trend per hour → DIR/stability.json and a verdict line")
    s.add_argument("--stability-cv", type=float, default=0.05, help="largest throughput/goodput CV (and change over "
                   "the run) the --stability verdict calls stable (default 0.05)")
    s.add_argument("--no-chunk-times", action="store_true", help="do not store every chunk time (smaller requests file)")
    s.add_argument("--drain-timeout", default="5s", help="on Ctrl-C/SIGTERM: how long requests in flight may finish "
                   "before they are cancelled (default 5s; a second Ctrl-C cancels at once)")
    s.add_argument("--quiet", action="store_true", help="no progress display and no console table")
    s.add_argument("--progress-interval", default="30s", help="when stdout is not a TTY: a plain progress line on "
                   "stderr this often (default 30s)")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Flags over the `--config run.toml` [replay] table over the defaults; env fallbacks for the target."""
    p = parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        p.set_defaults(**read_config(known.config, p))
    ns = p.parse_args(argv)
    if isinstance(ns.trace, str):  # `trace = "x.csv"` in the config file: one file
        ns.trace = [ns.trace]
    if ns.target is None:
        base = os.environ.get("OPENAI_BASE_URL")
        if not base:
            raise UsageError("the following arguments are required: --target (or set OPENAI_BASE_URL, "
                             "or target = \"...\" in --config)")
        ns.target = base.rstrip("/").removesuffix("/v1")
    return ns


def read_config(path: str, p: argparse.ArgumentParser) -> dict:
    """The [replay] table of a TOML file as parser defaults; keys are option names (`max-requests` or
    `max_requests`); list options (`slo`, `label`, `header`) take arrays."""
    from slogate.traces.toml_file import read_toml_file

    data = read_toml_file(path)
    table = data.get("replay", data)
    if not isinstance(table, dict):
        raise UsageError(f"--config {path}: [replay] must be a table")
    dests = {a.dest: a for a in p._actions if a.dest not in ("help", "config")}
    by_flag = {s.lstrip("-").replace("-", "_"): a.dest for a in p._actions for s in a.option_strings}
    out = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        dest = name if name in dests else by_flag.get(name)
        if dest is None or dest not in dests:
            raise UsageError(f"--config {path}: unknown key {key!r} in [replay]; use the option names of "
                             "slogate replay --help, e.g. target, model, synthetic, rate, max-requests, slo")
        action = dests[dest]
        if isinstance(action, argparse._AppendAction) and not isinstance(value, list):
            value = [value]
        if isinstance(value, int | float) and not isinstance(value, bool) and action.type is None:
            value = str(value) if isinstance(action.default, str) else value
        out[dest] = value
    return out


def build_workload(ns: argparse.Namespace) -> tuple[wl.Workload, str | None, str | None]:
    """The workload from the options; returns (workload, trace path, trace digest)."""
    duration = wl.parse_seconds(ns.duration) if ns.duration else None
    if ns.trace and ns.synthetic:  # ns.trace: a list (several agentic session files)
        raise UsageError("give either a TRACE or --synthetic, not both")
    trace_path = digest = None
    if ns.synthetic:
        from slogate.replay.profiles import synthesize

        spec = f"concurrency:c={ns.concurrency}" if ns.concurrency else ns.synthetic
        w = synthesize(spec, input_tokens=ns.input_tokens, output_tokens=ns.output_tokens, requests=ns.max_requests,
                       duration_s=duration, seed=ns.seed)
    elif ns.trace:
        from slogate.replay.source import load_trace, trace_workload

        trace = load_trace(ns.trace if len(ns.trace) > 1 else ns.trace[0], ns.fmt, block_size=ns.block_size)
        trace_path, digest = trace.path, trace.digest
        w = trace_workload(trace)
    else:
        raise UsageError("give a TRACE file or --synthetic SPEC (see slogate replay --help)")
    n_given = len(w.requests)
    transform(w, ns, duration)
    if not w.requests:
        narrowed = [flag for flag, value in (("--window", ns.window), ("--sample", ns.sample), ("--duration", ns.duration),
                                             ("--max-requests", ns.max_requests), ("--shard", ns.shard)) if value]
        if not n_given or not narrowed:
            raise UsageError("the trace has no requests to replay")
        raise UsageError(f"the workload is empty after {', '.join(narrowed)} (the trace has {n_given} requests)")
    if not w.measured:
        raise UsageError(f"--warmup {ns.warmup} covers all {len(w.requests)} requests: nothing is left to measure "
                         "(give a smaller --warmup or more requests)")
    return w, trace_path, digest


def transform(w: wl.Workload, ns: argparse.Namespace, duration: float | None) -> None:
    """Apply the workload options in their documented order (recorded in `w.description`)."""
    reqs, desc = w.requests, w.description
    if ns.window:
        start, end = wl.parse_window(ns.window)
        reqs = wl.window(reqs, start, end)
        desc.append(f"window={ns.window}")
    if ns.sample is not None:
        reqs = wl.sample(reqs, ns.sample, ns.seed)
        desc.append(f"sample={ns.sample:g}")
    if ns.speed is not None and not w.concurrency:
        reqs = wl.speed(reqs, ns.speed)
        desc.append(f"speed={ns.speed:g}")
    if ns.rate is not None and not w.concurrency:
        reqs = wl.rate(reqs, ns.rate)
        desc.append(f"rate={ns.rate:g}")
    if ns.concurrency is not None:
        if not 1 <= ns.concurrency <= MAX_CONCURRENCY:  # 1e30 ran forever building its loop
            raise UsageError(f"bad --concurrency {ns.concurrency}: must be 1 to {MAX_CONCURRENCY:,} requests in flight")
        w.concurrency, w.duration_s = ns.concurrency, duration
        desc.append(f"concurrency={ns.concurrency}" + (f" duration={ns.duration}" if ns.duration else ""))
    elif duration is not None:
        reqs = wl.duration(reqs, duration, loop=ns.loop)
        desc.append(f"duration={ns.duration}" + (" loop" if ns.loop else ""))
    elif ns.loop:
        raise UsageError("--loop needs --duration (how long to keep repeating the trace)")
    if ns.max_requests is not None:
        reqs = wl.max_requests(reqs, ns.max_requests)
        desc.append(f"max_requests={ns.max_requests}")
    if ns.warmup:
        text = ns.warmup.strip()
        reqs = wl.mark_warmup(reqs, count=int(text)) if text.isdigit() else wl.mark_warmup(reqs, seconds=wl.parse_seconds(text))
        desc.append(f"warmup={text}")
    think = session_timing(ns, reqs)
    if think:
        from slogate.replay import sessions

        if ns.loop or w.concurrency:
            raise UsageError("--loop/--concurrency do not combine with session timing: add --session-timing recorded")
        reqs = sessions.link(reqs, start=ns.session_start, seed=ns.seed)
        desc.append(f"sessions=think start={ns.session_start}")
        if (ns.speed is not None or ns.rate is not None) and not w.concurrency:
            print("slogate replay: warning: with session timing, --speed/--rate move when sessions start; each turn "
                  "still waits its think time after the previous one, so the offered rate is not the one asked "
                  "for (--session-timing recorded compresses every turn)", file=sys.stderr)
    elif getattr(ns, "session_start", "recorded") != "recorded":
        raise UsageError("--session-start needs session timing: a trace with sessions and --session-timing think")
    if ns.shard:
        i, n = wl.parse_shard(ns.shard)
        if think:
            from slogate.replay import sessions

            reqs = sessions.shard(reqs, i, n)
        else:
            reqs = wl.shard(reqs, i, n)
        desc.append(f"shard={ns.shard}")
    w.requests = reqs


def session_timing(ns: argparse.Namespace, reqs: list[wl.PlannedRequest]) -> bool:
    """True when turns are sent think time after the previous turn (the default with sessions)."""
    from slogate.replay.sessions import has_sessions

    choice = getattr(ns, "session_timing", None)
    if choice == "recorded":
        return False
    if not has_sessions(reqs):
        if choice == "think":
            raise UsageError("--session-timing think needs a trace with sessions (session ids on its requests)")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parse_args(argv)
    workload, options = plan(ns, command=["slogate", "replay", *argv])
    window = _stability_window(ns)
    options.stability_window_s = window
    if ns.repeat != 1:
        return run_repeats(workload, options, ns.repeat, console=not ns.quiet)
    result = run_and_write(workload, options, console=not ns.quiet)
    if window is not None:
        from slogate.replay.report import read_samples
        from slogate.replay.results import write_json
        from slogate.replay.stability import stability

        assert options.out_dir is not None
        samples, _ = read_samples(Path(options.out_dir) / "metrics.jsonl")
        st = stability(result.records, window, slos=options.slos, cv_threshold=ns.stability_cv, samples=samples)
        write_json(st, Path(options.out_dir) / "stability.json")
        print(f"stability: {st.verdict}")
    return 0


def run_repeats(workload: wl.Workload, options: ReplayOptions, n: int, *, console: bool) -> int:
    """`--repeat N`: the same replay N times, each in OUT/run-K; then the spread of every metric."""
    from slogate.replay.compare import load_side
    from slogate.replay.repeats import HEADLINE, combine, noise
    from slogate.replay.results import write_json
    from slogate.replay.target import with_repeat_seed

    if n < 2:
        raise UsageError(f"bad --repeat {n}: give the number of runs, 2 or more (1 is a plain replay)")
    if options.shard is not None or options.start_at is not None:
        raise UsageError("--repeat cannot be combined with --shard/--start-at: repeat the sharded run instead")
    out = Path(options.out_dir or ".")
    sides = []
    for k in range(1, n + 1):
        run_dir = out / f"run-{k}"
        target = with_repeat_seed(options.target, k)  # a sim: target gets seed + k - 1
        print(f"slogate replay: repeat {k}/{n} → {run_dir}" + (f" ({target})" if target != options.target else ""),
              flush=True)
        run_and_write(workload, msgspec.structs.replace(options, out_dir=str(run_dir), target=target), console=console)
        sides.append(load_side(run_dir, slos=options.slos, name=f"run-{k}"))
    spreads = noise(combine(sides))
    write_json({"n": n, "runs": [f"run-{k}" for k in range(1, n + 1)],
                "spread": {key: msgspec.to_builtins(sp) for key, sp in spreads.items()}}, out / "repeats.json")
    print(f"run-to-run spread over {n} repeats (mean ± sd, CV):")
    for key in HEADLINE:
        sp = spreads.get(key)
        if sp is not None:
            cv = "–" if sp.cv is None else f"{sp.cv * 100:.1f} %"
            print(f"  {key:<22} {sp.mean:.6g} ± {sp.sd:.3g}  (CV {cv}; {sp.low:.6g} … {sp.high:.6g})")
    print(f"repeats: {out}/repeats.json")
    return 0




def _stability_window(ns: argparse.Namespace) -> float | None:
    if not ns.stability:
        return None
    from slogate.replay.stability import parse_window

    if not 0 < ns.stability_cv < 1:
        raise UsageError(f"bad --stability-cv {ns.stability_cv}: expected a fraction like 0.05")
    try:
        return parse_window(ns.stability)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def plan(ns: argparse.Namespace, *, command: list[str]) -> tuple[wl.Workload, ReplayOptions]:
    """The workload and the run's options from parsed `slogate replay` options (`options.out_dir` is
    where the results go). `command` is recorded in results.json as the command that made the run."""
    from slogate.replay.forcing import choose
    from slogate.replay.run import ReplayOptions
    from slogate.traces.slo import SloError, parse_slo

    choose(ns.force_output, "unknown")  # syntax check before any network
    try:
        w, trace_path, digest = build_workload(ns)
        slos = [parse_slo(s, default_name=f"slo{i}" if i else "default") for i, s in enumerate(ns.slo)]
    except (wl.WorkloadError, SloError) as exc:
        raise UsageError(str(exc)) from None
    if ns.cost_per_hour is not None and not 0 <= ns.cost_per_hour < math.inf:
        raise UsageError(f"bad --cost-per-hour {ns.cost_per_hour!r}: USD per hour of the setup, ≥ 0 (e.g. 2.5)")
    timeout_s = seconds(ns.timeout, "--timeout")
    if not timeout_s > 0:
        raise UsageError(f"bad --timeout {ns.timeout}: must be > 0 (e.g. 600s)")
    out = Path(ns.out or time.strftime("slogate-replay-%Y%m%d-%H%M%S"))
    output_dir(out)  # before any request is sent
    options = ReplayOptions(
        target=ns.target, model=ns.model, endpoint=ns.endpoint, stream=not ns.no_stream,
        headers=request_headers(ns.header), api_key=ns.api_key, timeout_s=timeout_s,
        retries=ns.retries, retry_backoff_s=seconds(ns.retry_backoff, "--retry-backoff"), force_output=ns.force_output,
        tokenizer=ns.tokenizer, workers=ns.workers, virtual=ns.virtual, slos=slos, cost_per_hour=ns.cost_per_hour,
        lag_bound_s=seconds(ns.lag_bound, "--lag-bound"), seed=ns.seed, labels=pairs(ns.label, "=", "--label"),
        scrape_interval_s=seconds(ns.scrape_metrics, "--scrape-metrics") if ns.scrape_metrics else None,
        out_dir=str(out), start_at=ns.start_at, shard=ns.shard,
        progress=not ns.quiet and not ns.virtual,
        progress_interval_s=None if sys.stdout.isatty() else seconds(ns.progress_interval, "--progress-interval"),
        command=command, trace=trace_path, trace_digest=digest,
        keep_chunk_times=not ns.no_chunk_times, stop_on_error=getattr(ns, "on_turn_error", "continue") == "stop",
        prompt_tokens=ns.prompt_tokens, calibrate=not ns.no_calibrate,
        drain_timeout_s=seconds(ns.drain_timeout, "--drain-timeout"),
        session_header=session_header(ns.session_header),
    )
    return w, options


MAX_CONCURRENCY = 1_000_000  # requests a closed loop keeps in flight: beyond any server's seats

# Headers the replay's client writes itself: the message's framing and the JSON body's type. As options
# they would contradict it (a Content-Length of the wrong size failed every request).
CLIENT_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "te", "upgrade",
                            "expect", "content-type"})
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP field name (RFC 9110 token)


def request_headers(items: list[str]) -> dict[str, str]:
    """--header K:V (repeatable): extra request headers. `Host` replaces the target's (an ingress by address)."""
    headers = pairs(items, ":", "--header")
    for name in headers:
        if not HEADER_NAME.fullmatch(name):
            raise UsageError(f"bad --header {name!r}: not a header name (letters, digits and -, e.g. X-Tenant:a)")
        if name.lower() in CLIENT_HEADERS:
            raise UsageError(f"bad --header {name}:…: the replay writes {name} itself; drop the option")
    return headers


def session_header(name: str) -> str | None:
    """--session-header NAME (an HTTP header name) or off."""
    if name.strip().lower() == "off":
        return None
    if not HEADER_NAME.fullmatch(name):
        raise UsageError(f"bad --session-header {name!r}: give a header name like X-Session-Id, or off")
    if name.lower() in CLIENT_HEADERS | {"host", "authorization"}:
        raise UsageError(f"bad --session-header {name!r}: the replay sets {name} itself; use a header of its own "
                         "like X-Session-Id")
    return name


def run_and_write(workload: wl.Workload, options: ReplayOptions, *, console: bool = True) -> RunOutput:
    """`replay.run.replay`, then the run's files in `options.out_dir`; returns the run in memory.

    An interrupted run writes its results, then raises SystemExit(128 + signal), not a returned
    status, so an in-process caller (slogate sweep) stops too, as on Ctrl-C."""
    from slogate.replay.interrupt import Interrupted, deferred
    from slogate.replay.run import replay

    assert options.out_dir is not None
    out = Path(options.out_dir)
    try:
        result = replay(workload, options)
    except Interrupted as exc:
        print(f"slogate replay: interrupted ({signal.Signals(exc.signum).name}) before any request was sent; "
              "nothing written", file=sys.stderr, flush=True)
        raise SystemExit(128 + exc.signum) from None
    with deferred() as late:  # a signal now would only leave half-written files: finish writing first
        write_outputs(result, out, console=console)
    signum = result.signal or (late[0] if late else None)
    if signum is None:
        return result
    if result.signal is not None:
        print(interrupted_line(result.results.summary, signum, out), file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def interrupted_line(summary: RunSummary, signum: int, out: Path) -> str:
    from slogate.replay.outputs.console import interruption_counts

    return (f"slogate replay: INTERRUPTED by {signal.Signals(signum).name}: {interruption_counts(summary)}; "
            f"results written to {out}")


def write_outputs(result: RunOutput, out: Path, *, console: bool = True) -> None:
    from slogate.replay.outputs import console as console_out
    from slogate.replay.outputs import csv as csv_out
    from slogate.replay.outputs import json as json_out
    from slogate.replay.outputs import records as records_out

    out.mkdir(parents=True, exist_ok=True)
    json_out.write(result.results, out)
    records_out.write(result.header, result.records, out)
    csv_out.write(result.results, out)
    if console:
        console_out.render(result.results)
        print(f"results: {out}/results.json, {out}/requests.jsonl.zst, {out}/summary.csv")
