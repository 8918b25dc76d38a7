"""`slogate demo`: simulated production behind the gateway, a bundled real trace replayed through it and
captured, what-if replays of the capture, comparison and report. Orchestration only (the steps are
slogate's own subcommands); every process it starts is stopped on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from slogate.replay.child_process import free_port
from slogate.replay.demo.live import Display, fetch_status, status_line, watch_replay
from slogate.replay.demo.procs import Children, wait_ready
from slogate.replay.demo.steps import (
    Run,
    Setup,
    capacity_sweep,
    comparison,
    parse_candidates,
    parse_setup,
    price_of,
    print_comparison,
    virtual_replay,
    write_report,
)
from slogate.replay.interrupt import interrupt_status, signals_as_interrupt
from slogate.replay.sim.catalog import GPUS
from slogate.traces.usage import UsageError

DEFAULT_SLO = "interactive:ttft=0.5,tpot=50ms"
DEFAULT_PRICES = "a100-80g=1.8,h100-sxm=3,l40s=1.2"  # example USD per GPU-hour (on-demand cloud, 2025)
DEFAULT_SWEEP = "0.25,0.5,1,1.5,2,3"
DRAIN_S = 90.0  # how long the live replay may run past its schedule (streams still in flight)
READY_S = 30.0

DESCRIPTION = """\
The whole slogate loop on your machine, no GPU needed (about 1½ minutes with the defaults):

  1. start a simulated "production" server (slogate sim, --gpu-baseline, default a100-80g running
     llama-3-8b) and slogate gateway in front of it, with an SLO (--slo) and trace capture on;
  2. replay a bundled real trace slice (Azure LLM inference, conversation, 2023; --trace to use your
     own) through the gateway for --duration seconds at --speed, printing the gateway's live
     /slogate/status (request rate, goodput, SLO attainment, TTFT/TPOT p99) every few seconds;
  3. take the anonymized trace the gateway just captured (timings, lengths, prefix structure, no
     text) and replay it in virtual time against the baseline and each --candidates setup, and
     sweep the baseline over --sweep-speeds of the capture (its capacity, knee and replicas);
  4. print a side-by-side comparison (throughput, goodput, SLO attainment, TTFT/TPOT p50/p99;
     deltas vs the baseline, the last column is production as the gateway measured it) and write
     report.html, the captured trace and every run's results.json into one folder (--out).

Ctrl-C (or SIGTERM) at any point stops every process the demo started."""

EPILOG = f"""\
setups (--gpu-baseline, --candidates): GPU[/MODEL][?dtype=fp8&tp=2&…], the options of slogate sim
  (gpus: {", ".join(sorted(GPUS))}; dtypes: bf16, fp8, int8, int4)

output folder:
  capture/            the trace the gateway captured (slogate trace format, zstd JSON lines)
  production-live/    the live replay as the client saw it (results.json, requests.jsonl.zst, summary.csv)
  <setup>/            one virtual-time replay of the capture per setup (same files)
  sweep-<baseline>/   the baseline's capacity sweep (sweep.json, a point-<speed>/ run per speed)
  report.html         every run in one self-contained page (conclusions.json: its conclusions);
                      comparison.txt the printed table
  logs/               sim, gateway and replay-client logs

examples:
  slogate demo
  slogate demo --duration 30 --speed 2 --out /tmp/demo
  slogate demo --gpu-baseline l40s --candidates 'h100-sxm,h200,a100-80g?dtype=fp8' --no-progress"""


class DemoOptions(msgspec.Struct, kw_only=True):
    duration_s: float
    speed: float
    out: Path
    trace: Path
    model: str
    baseline: Setup
    candidates: list[Setup]
    slo: str
    slo_name: str
    seed: int
    status_every_s: float
    prices: dict[str, float]
    sweep_speeds: list[float]
    mode: str  # rich | plain | quiet


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slogate demo", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", default="60s", help="step 2: how long to replay through the gateway, wall clock "
                   "(default 60s; 30, 45s, 2m)")
    p.add_argument("--speed", type=float, default=1.5, help="step 2: time compression of the trace (default 1.5: "
                   "it pushes the simulated A100 past its capacity halfway through, so the SLO is met for only part "
                   "of the requests)")
    p.add_argument("--out", help="output folder (default ./demo-out/YYYYmmdd-HHMMSS)")
    p.add_argument("--trace", help="step 2: the trace to replay (default: the bundled azure_conv_10min.csv; "
                   "any format slogate replay reads)")
    p.add_argument("--model", default="llama-3-8b", help="simulated model of every setup that names none "
                   "(default llama-3-8b)")
    p.add_argument("--gpu-baseline", default="a100-80g", metavar="SETUP", help="steps 1 and 3: the production "
                   "setup, simulated live behind the gateway and replayed as the baseline (default a100-80g)")
    p.add_argument("--candidates", default="h100-sxm,l40s?dtype=fp8", metavar="SETUP,…", help="step 3: setups "
                   "to replay the captured trace against (default h100-sxm,l40s?dtype=fp8)")
    p.add_argument("--slo", default=DEFAULT_SLO, help=f"the SLO for goodput and attainment (default {DEFAULT_SLO})")
    p.add_argument("--price", default=DEFAULT_PRICES, metavar="GPU=USD,…", help="USD per GPU-hour, for the cost "
                   f"per million good tokens (default {DEFAULT_PRICES}: example on-demand prices; '' for none)")
    p.add_argument("--sweep-speeds", default=DEFAULT_SWEEP, metavar="X,…", help="step 3: the speeds of the capture "
                   f"the baseline is swept over, for its capacity (default {DEFAULT_SWEEP}; '' for no sweep)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulators and prompt synthesis (default 0)")
    p.add_argument("--status-every", default="5s", help="step 2: how often to print the gateway status (default 5s)")
    p.add_argument("--no-progress", action="store_true", help="plain lines instead of progress bars (the "
                   "default when stdout is not a terminal)")
    p.add_argument("--quiet", action="store_true", help="print only the comparison and the output folder")
    return p


def options(ns: argparse.Namespace) -> DemoOptions:
    """Validate everything before starting a process: a bad flag costs nothing."""
    from slogate.replay.workload import WorkloadError, parse_seconds
    from slogate.traces.samples import AZURE_CONV, path
    from slogate.traces.slo import SloError, parse_slo

    try:
        duration, every = parse_seconds(ns.duration), parse_seconds(ns.status_every)
        slo = parse_slo(ns.slo, default_name="default")
    except (WorkloadError, SloError) as exc:
        raise UsageError(str(exc)) from None
    if duration <= 0 or every <= 0:
        raise UsageError(f"--duration and --status-every must be positive (got {ns.duration!r}, {ns.status_every!r})")
    if not ns.speed > 0:
        raise UsageError(f"--speed must be positive (got {ns.speed:g}); 2 replays the trace twice as fast")
    trace = Path(ns.trace) if ns.trace else path(AZURE_CONV)
    if not trace.exists():
        raise UsageError(f"--trace {trace}: no such file or directory")
    out = Path(ns.out) if ns.out else Path("demo-out") / time.strftime("%Y%m%d-%H%M%S")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder: pick a new one (or leave --out out)")
    baseline = parse_setup(ns.gpu_baseline, ns.model)
    from slogate.replay.cli.sweep import parse_points
    from slogate.replay.plan.candidates import parse_prices

    prices = parse_prices(ns.price)
    speeds = parse_points(ns.sweep_speeds, "sweep-speeds") if ns.sweep_speeds.strip() else []
    mode = "quiet" if ns.quiet else "plain" if ns.no_progress or not sys.stdout.isatty() else "rich"
    if mode == "rich":
        try:
            import rich  # noqa: F401
        except ImportError:
            mode = "plain"
    return DemoOptions(duration_s=duration, speed=ns.speed, out=out.resolve(), trace=trace.resolve(), model=ns.model,
                       baseline=baseline, candidates=parse_candidates(ns.candidates, ns.model, baseline),
                       slo=ns.slo, slo_name=slo.name, seed=ns.seed, status_every_s=every, mode=mode, prices=prices,
                       sweep_speeds=speeds)


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    opts = options(ns)
    display = Display(opts.mode)
    with signals_as_interrupt():
        try:
            run(opts, display)
        except KeyboardInterrupt as exc:
            status, what = interrupt_status(exc)
            print(f"\nslogate demo: {what}; every process it started is stopped. Partial output: {opts.out}",
                  file=sys.stderr, flush=True)
            return status
    return 0


def run(opts: DemoOptions, display: Display) -> None:
    t0 = time.monotonic()
    opts.out.mkdir(parents=True, exist_ok=True)
    capture, live_dir = opts.out / "capture", opts.out / "production-live"
    display.say(f"slogate demo → {opts.out}")
    with tempfile.TemporaryDirectory(prefix="slogate-demo-") as tmp, Children(opts.out / "logs") as children:
        gateway_url, admin_url = start_servers(opts, children, Path(tmp) / "trace_salt", capture, display)
        replay_child = children.start("replay", [
            "replay", str(opts.trace), "--speed", f"{opts.speed:g}", "--duration", f"{opts.duration_s:g}s",
            "--target", gateway_url, "--slo", opts.slo, "--seed", str(opts.seed), "--timeout", "60",
            "--quiet", "--out", str(live_dir), "--label", f"gpu={opts.baseline.opts.get('gpu')}",
            "--label", "role=production", *_cost_flags(price_of(opts.baseline, opts.prices))])
        title = (f"step 2/4  replaying {opts.trace.name} through the gateway: {opts.duration_s:g} s at "
                 f"{opts.speed:g}x speed (trace seconds 0–{opts.duration_s * opts.speed:g})")
        final = watch_replay(replay_child, children.started[:2], admin_url, title=title, duration_s=opts.duration_s,
                             drain_s=DRAIN_S, slo_name=opts.slo_name, every_s=opts.status_every_s, display=display)
        if final is not None:
            display.say(f"  [all] {status_line(final, opts.slo_name, window='5m')}  (the whole run)")
        for child in reversed(children.started):  # the gateway flushes and closes its trace segment on SIGTERM
            children.stop(child)
    n_captured = captured_requests(capture)
    display.say(f"  captured {n_captured} requests in {capture} (lengths, timings, prefix hashes; no text)")

    setups = [(opts.baseline, "baseline"), *((c, "candidate") for c in opts.candidates)]
    names = ", ".join(s.name + (" (baseline)" if role == "baseline" else "") for s, role in setups)
    runs: list[Run] = []
    sweep_dir = opts.out / f"sweep-{opts.baseline.name}"
    swept = f" and sweeping {opts.baseline.name} over speeds {','.join(f'{x:g}' for x in opts.sweep_speeds)}"
    with display.task(f"step 3/4  replaying the capture in virtual time against {names}"
                      + (swept if opts.sweep_speeds else ""), total=len(setups) + bool(opts.sweep_speeds)) as update:
        for i, (setup, role) in enumerate(setups):
            update(i, setup.target)
            runs.append(virtual_replay(capture, setup, opts.out / setup.name, slo=opts.slo, seed=opts.seed, role=role,
                                       cost_per_hour=price_of(setup, opts.prices)))
        if opts.sweep_speeds:
            update(len(setups), f"sweep {opts.baseline.target}")
            capacity_sweep(capture, opts.baseline, sweep_dir, slo=opts.slo, seed=opts.seed, speeds=opts.sweep_speeds,
                           cost_per_hour=price_of(opts.baseline, opts.prices))
        update(len(setups) + bool(opts.sweep_speeds), "")

    with display.task("step 4/4  comparing the runs and writing report.html"):
        sides, plain = comparison(runs, capture, opts.slo)
        (opts.out / "comparison.txt").write_text(plain, encoding="utf-8")
        report, plots = write_report([run.path for run in runs] + [live_dir] + ([sweep_dir] if opts.sweep_speeds else []),
                                     opts.out / "report.html")
    display.result("")
    print_comparison(sides, plain, rich=opts.mode == "rich")
    display.result(f"deltas are vs the baseline {opts.baseline.name} (virtual-time replay of the capture); "
                   f"'{sides[-1].name}' is the live run as the gateway measured it.")
    display.result(f"report: {report}" + ("" if plots else " (tables only: pip install slogate[report] for plots)"))
    display.result(f"output folder: {opts.out}  (finished in {time.monotonic() - t0:.0f} s)")


def _cost_flags(cost_per_hour: float | None) -> list[str]:
    return [] if cost_per_hour is None else ["--cost-per-hour", f"{cost_per_hour:g}"]


def start_servers(opts: DemoOptions, children: Children, salt: Path, capture: Path,
                  display: Display) -> tuple[str, str]:
    """Step 1: the simulated production server and the gateway in front of it; returns the gateway's proxy
    URL and its admin URL (/slogate/status)."""
    from slogate.replay.target import sim_args

    sim_port, gateway_port, admin_port = free_port(), free_port(), free_port()
    while len({sim_port, gateway_port, admin_port}) < 3:
        gateway_port, admin_port = free_port(), free_port()
    sim_url, gateway_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gateway_port}"
    admin_url = f"http://127.0.0.1:{admin_port}"
    display.say(f"step 1/4  starting slogate sim ({opts.baseline.target}) on {sim_url}")
    display.say(f"          and slogate gateway on {gateway_url} (SLO {opts.slo}, capture on)")
    sim = children.start("sim", ["sim", *sim_args(opts.baseline.opts), "--port", str(sim_port),
                                 "--seed", str(opts.seed)])
    gateway = children.start("gateway", [
        "gateway", "--listen", f"127.0.0.1:{gateway_port}", "--admin-listen", f"127.0.0.1:{admin_port}",
        "--upstream", sim_url, "--slo", opts.slo,
        "--trace-dir", str(capture), "--trace-salt-file", str(salt), "--trace-chunk-times", "--shutdown-grace", "5",
        "--log-level", "warning"])
    ready_sim = wait_ready(sim, f"{sim_url}/health", READY_S)
    ready_gw = wait_ready(gateway, f"{gateway_url}/readyz", READY_S)
    display.say(f"  sim ready in {ready_sim:.1f} s (pid {sim.pid}), gateway ready in {ready_gw:.1f} s "
                f"(pid {gateway.pid}); live status: {admin_url}/slogate/status")
    if fetch_status(admin_url) is None:
        raise UsageError(f"the gateway's admin listener {admin_url} serves no /slogate/status (log: {gateway.log})")
    return gateway_url, admin_url


def captured_requests(capture: Path) -> int:
    from slogate.traces.reader import read_trace
    from slogate.traces.segments import TraceError

    try:
        n = len(read_trace(capture).records)
    except TraceError as exc:
        raise UsageError(f"the captured trace in {capture} is unreadable: {exc}") from None
    if not n:
        raise UsageError(f"the gateway captured no requests in {capture} (see {capture.parent / 'logs'})")
    return n
