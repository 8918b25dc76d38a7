"""The demo's in-process steps: which simulated setups to compare and what they cost, the virtual-time
replays of the captured trace, the baseline's capacity sweep, the side-by-side comparison and the report.

Reuses `slogate replay` and `slogate sweep` in memory (replay.cli.replay.run_and_write,
replay.cli.sweep.run_sweep), replay.compare, replay.cli.compare and replay.report; holds no metric logic.
"""

from __future__ import annotations

import contextlib
import io
import urllib.parse
from pathlib import Path

import msgspec

from slogate.replay.results import Results
from slogate.replay.target import parse_target, sim_config
from slogate.traces.usage import UsageError

# The rows of the demo's comparison (replay.compare metric paths).
ROWS = ("requests", "failed", "request_rate_rps", "output_tokens_per_s", "goodput_rps", "goodput_tokens_per_s",
        "slo_attainment", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "e2e_s.p99")
CAPTURE_SIDE = "production"  # the column of the captured trace (the gateway's own measurements)


class Setup(msgspec.Struct, frozen=True):
    """One simulated setup: a short name (directory and column), its `sim:` target and sim options."""

    name: str
    target: str
    opts: dict[str, str]


def parse_setup(text: str, model: str) -> Setup:
    """`GPU[/MODEL][?k=v&…]` (or the same with a `sim:` prefix) → Setup; validated against the sim catalog."""
    body = text.strip().removeprefix("sim:")
    path, _, query = body.partition("?")
    gpu, _, model_name = path.partition("/")
    if not gpu:
        raise UsageError(f"bad setup {text!r}: expected GPU[/MODEL][?dtype=fp8&tp=2…], e.g. l40s?dtype=fp8")
    target = f"sim:{gpu}/{model_name or model}" + (f"?{query}" if query else "")
    opts = parse_target(target).sim or {}
    from slogate.replay.sim.config import build

    build(sim_config(opts))  # unknown GPU/model/dtype → UsageError naming the choices
    suffix = "-".join(v if k in ("dtype", "kv_dtype") else f"{k}{v}" for k, v in urllib.parse.parse_qsl(query))
    name = gpu.lower() + (f"-{model_name}" if model_name and model_name != model else "") + (f"-{suffix}" if suffix else "")
    return Setup(name=name.replace("/", "-").replace("=", ""), target=target, opts=opts)


def parse_candidates(text: str, model: str, baseline: Setup) -> list[Setup]:
    setups = [parse_setup(part, model) for part in text.split(",") if part.strip()]
    if not setups:
        raise UsageError("--candidates is empty: give one or more setups like h100-sxm,l40s?dtype=fp8")
    names = {baseline.name}
    out = []
    for s in setups:
        name, n = s.name, 2
        while name in names or name in ("capture", "logs", "production-live"):
            name, n = f"{s.name}-{n}", n + 1
        names.add(name)
        out.append(msgspec.structs.replace(s, name=name))
    return out


class Run(msgspec.Struct):
    """One virtual-time replay of the capture: its column name, run directory and Results."""

    name: str
    path: Path
    results: Results


def price_of(setup: Setup, prices: dict[str, float]) -> float | None:
    """USD per hour of the setup: its GPU's price (replay.plan.candidates.parse_prices keys) × GPUs (tp)."""
    from slogate.replay.sim import catalog

    gpu = catalog.find_gpu(setup.opts.get("gpu", setup.name)).name.lower()
    if gpu not in prices:
        return None
    return prices[gpu] * int(setup.opts.get("tp", "1") or 1)


def replay_flags(capture: Path, setup: Setup, *, slo: str, seed: int, labels: dict[str, str],
                 cost_per_hour: float | None) -> list[str]:
    """The `slogate replay` options of a virtual-time replay of the capture against `setup` (no --out)."""
    return [str(capture), "--target", setup.target, "--virtual", "--slo", slo, "--seed", str(seed), "--quiet",
            *(f for k, v in labels.items() for f in ("--label", f"{k}={v}")),
            *(("--cost-per-hour", f"{cost_per_hour:g}") if cost_per_hour is not None else ())]


def capacity_sweep(capture: Path, setup: Setup, out: Path, *, slo: str, seed: int, speeds: list[float],
                   cost_per_hour: float | None) -> Path:
    """`slogate sweep CAPTURE --target sim:… --virtual --speeds …` in-process: the baseline's curve, knee
    and the largest speed of the capture that meets the SLO (out/sweep.json, a point-<x>/ per speed)."""
    from slogate.replay.cli import replay as replay_cli
    from slogate.replay.cli.sweep import run_sweep

    labels = {"gpu": setup.opts.get("gpu", setup.name), "role": "sweep"}
    args = replay_flags(capture, setup, slo=slo, seed=seed, labels=labels, cost_per_hour=cost_per_hour)
    with contextlib.redirect_stdout(io.StringIO()):
        run_sweep(args, replay_cli.parse_args(args), mode="speed", flag="--speed", xs=speeds, out=out, attainment=0.9,
                  refine=1, command=["slogate", "sweep", *args, "--speeds", ",".join(f"{x:g}" for x in speeds),
                                     "--refine", "1", "--out", str(out)])
    return out


def virtual_replay(capture: Path, setup: Setup, out: Path, *, slo: str, seed: int, role: str,
                   cost_per_hour: float | None = None) -> Run:
    """`slogate replay CAPTURE --target sim:… --virtual` in-process (replay.run, files written to `out`)."""
    from slogate.replay.cli.replay import run_and_write
    from slogate.replay.run import ReplayOptions
    from slogate.replay.source import load_trace, trace_workload
    from slogate.traces.slo import parse_slo

    labels = {"gpu": setup.opts.get("gpu", setup.name), "role": role}
    if setup.opts.get("dtype"):
        labels["dtype"] = setup.opts["dtype"]
    trace = load_trace(capture)
    workload = trace_workload(trace)
    if not workload.requests:
        raise UsageError(f"{capture}: the captured trace holds no requests")
    command = ["slogate", "replay", *replay_flags(capture, setup, slo=slo, seed=seed, labels=labels,
                                                  cost_per_hour=cost_per_hour), "--out", str(out)]
    options = ReplayOptions(target=setup.target, virtual=True, slos=[parse_slo(slo, default_name="default")], seed=seed,
                            labels=labels, out_dir=str(out), command=command, trace=trace.path, trace_digest=trace.digest,
                            cost_per_hour=cost_per_hour)
    result = run_and_write(workload, options, console=False)
    return Run(name=setup.name, path=out, results=result.results)


def comparison(runs: list[Run], capture: Path, slo_spec: str) -> tuple[list, str]:
    """Each run (the first is the baseline) plus the captured trace as the last side.

    Returns (sides, plain-text table) for `print_comparison` and comparison.txt."""
    from slogate.replay.cli import compare as compare_cli
    from slogate.replay.compare import CompareError, Side, load_side
    from slogate.traces.slo import parse_slo

    slo = parse_slo(slo_spec, default_name="default")
    sides = [Side(name=run.name, source=str(run.path), kind="run", results=run.results) for run in runs]
    try:
        sides.append(load_side(capture, slos=[slo], name=CAPTURE_SIDE))
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        compare_cli.render(sides, ROWS, force_plain=True)
    return sides, buf.getvalue()


def print_comparison(sides: list, plain: str, *, rich: bool) -> None:
    """The compare table: rich (coloured deltas) when asked and it fits the terminal, else plain text."""
    if rich:
        from slogate.replay.cli import compare as compare_cli

        compare_cli.render(sides, ROWS)
    else:
        print(plain, end="", flush=True)


def write_report(run_dirs: list[Path], path: Path) -> tuple[Path, bool]:
    """report.html of every run (replay.report); returns (path, plots drawn)."""
    from slogate.replay import report

    try:
        return report.write_report(run_dirs, path), report.plots_available()
    except report.ReportError as exc:
        raise UsageError(str(exc)) from None
