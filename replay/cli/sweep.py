"""`slogate sweep TRACE --target … --speeds 0.5,1,2,4 --out DIR`: one `slogate replay` run per point
(`--speeds`, `--rates` or `--concurrency`), then DIR/sweep.json with the curve, the knee and the
largest load meeting the SLO attainment target (optionally refined by bisection), and a table.

Every option it does not know is passed unchanged to `slogate replay` (TRACE, --target, --model,
--slo, --virtual, …). Each point is a whole replay run, called in memory (replay.cli.replay's
`plan` and `run_and_write`), its files written as `slogate replay` writes them. With `--serve-cmd`
and `--grid`, one such sweep per grid point against a server started for it (replay.serve_cmd),
DIR/<point>/ each and DIR/grid.json. Never measures anything itself.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from slogate.replay import serve_cmd
from slogate.replay import sweep as sweep_io
from slogate.replay.child_process import free_port
from slogate.replay.cli import replay as replay_cli
from slogate.replay.cli.args import output_dir
from slogate.replay.interrupt import interrupt_status, signals_as_interrupt
from slogate.replay.redact import redact
from slogate.replay.results import Results
from slogate.replay.sweep import Sweep, SweepPoint, analyze, next_refine_x, point_dir_name, point_from_results
from slogate.traces.slo import SloError, parse_slo
from slogate.traces.usage import UsageError

MODES = (("speeds", "speed", "--speed"), ("rates", "rate", "--rate"), ("concurrency", "concurrency", "--concurrency"))
RESERVED = ("--speed", "--rate", "--concurrency", "--out")
UNSWEPT = ("--repeat", "--stability")  # replay options its own main() runs after the run: a sweep's points would drop them


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slogate sweep",
        usage="slogate sweep TRACE --target URL (--speeds X,… | --rates R,… | --concurrency C,…) --out DIR "
        "[--attainment 0.9] [--refine N] [any slogate replay option …]",
        description="Run one replay per load point and find the knee and the largest load meeting the SLO.",
        epilog="example:\n  slogate sweep prod.jsonl.zst --target http://gpu-box:8000 --model llama-3-8b \\\n"
        "      --slo ttft=0.5,tpot=50ms --speeds 0.5,1,2,4,8 --refine 2 --out sweeps/h100\n"
        "  slogate report sweeps/h100 -o sweep.html\n"
        "  # a server per grid point: {port} and every --grid KEY are filled in\n"
        "  slogate sweep prod.jsonl.zst --model llama-3-8b --slo ttft=0.5 --speeds 1,2,4 --out sweeps/seqs \\\n"
        "      --serve-cmd 'vllm serve meta-llama/Meta-Llama-3-8B --port {port} --max-num-seqs {max_num_seqs}' \\\n"
        "      --grid max_num_seqs=64,128,256\n\n" + sweep_io.KNEE_RULE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--rate 5` / `--speed 2` must not be read as --rates / --speeds
    )
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--speeds", metavar="X,…", help="speed factors (time compression of the trace)")
    group.add_argument("--rates", metavar="R,…", help="mean request rates (req/s)")
    group.add_argument("--concurrency", metavar="C,…", help="closed-loop concurrency levels")
    p.add_argument("--out", required=True, metavar="DIR", help="sweep directory (point-<x>/ per point, sweep.json)")
    p.add_argument("--attainment", type=float, default=0.9, help="SLO attainment target (default 0.9)")
    p.add_argument("--refine", type=int, default=0, metavar="N", help="extra runs bisecting the attainment boundary")
    p.add_argument("--serve-cmd", metavar="CMD", help="start this server per grid point ({port} and {KEY} placeholders)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="with --serve-cmd: the values of {KEY} (repeatable: every combination)")
    p.add_argument("--ready-timeout", type=float, default=60.0, metavar="S", help="seconds a server has to answer /v1/models")
    p.add_argument("--resume", action="store_true", help="with --serve-cmd: skip grid points whose sweep finished")
    p.add_argument("--replay-output", action="store_true", help="show each replay's own output (default: point-<x>/replay.log)")
    return p


def parse_points(text: str, flag: str, *, integer: bool = False) -> list[float]:
    try:
        values = sorted({float(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"bad --{flag} {text!r}: expected comma-separated numbers, e.g. 0.5,1,2,4") from None
    if not values or any(not 0 < v < math.inf for v in values):
        raise UsageError(f"bad --{flag} {text!r}: give one or more positive numbers, e.g. 0.5,1,2,4")
    if integer and any(v != int(v) for v in values):
        raise UsageError(f"bad --{flag} {text!r}: concurrency levels are whole numbers, e.g. 1,4,16,64")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    args, replay_args = build_parser().parse_known_args(list(argv) if argv is not None else None)
    for arg in replay_args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED:
            raise UsageError(f"{flag} is set by the sweep itself; use --speeds/--rates/--concurrency and --out")
        if flag in UNSWEPT:
            raise UsageError(f"{flag} does not combine with slogate sweep (each point is one run); "
                             "drop it, or slogate replay that point with it")
    if not replay_args:
        raise UsageError("give the trace and the replay options, e.g. slogate sweep TRACE --target URL --speeds 1,2,4 --out DIR")
    if not 0 < args.attainment <= 1:
        raise UsageError(f"bad --attainment {args.attainment}: a fraction in (0, 1], e.g. 0.9")
    if args.refine < 0:
        raise UsageError(f"bad --refine {args.refine}: a number of extra runs ≥ 0")
    opt, mode, flag = next(m for m in MODES if getattr(args, m[0]) is not None)
    xs = parse_points(getattr(args, opt), opt, integer=mode == "concurrency")
    if (args.grid or args.resume) and not args.serve_cmd:
        raise UsageError("--grid and --resume go with --serve-cmd 'CMD … {port} …'")
    output_dir(Path(args.out))  # before the first point
    # Ctrl-C or SIGTERM between points (or while a --serve-cmd server starts) unwinds through the
    # cleanup: a started server is stopped, never left behind. During a point the replay handles them.
    with signals_as_interrupt():
        try:
            if args.serve_cmd:
                return run_grid(args, replay_args, mode=mode, flag=flag, xs=xs,
                                argv=list(argv if argv is not None else sys.argv[1:]))
            return run_plain(args, replay_args, mode=mode, flag=flag, xs=xs, argv=argv)
        except KeyboardInterrupt as exc:
            status, what = interrupt_status(exc)
            print(f"\nslogate sweep: {what}; any server it started is stopped; {args.out} holds the points that "
                  "finished", file=sys.stderr, flush=True)
            return status


def run_plain(args: argparse.Namespace, replay_args: list[str], *, mode: str, flag: str, xs: Sequence[float],
              argv: Sequence[str] | None) -> int:
    """One sweep against --target."""
    replay_ns = replay_cli.parse_args(replay_args)  # a mistake stops the sweep before its first point
    sweep = run_sweep(replay_args, replay_ns, mode=mode, flag=flag, xs=xs, out=Path(args.out),
                      attainment=args.attainment, refine=args.refine, verbose=args.replay_output,
                      command=["slogate", "sweep", *(argv if argv is not None else sys.argv[1:])])
    print_table(sweep, Path(args.out))
    return 0


def parse_grid(items: Sequence[str]) -> list[dict[str, str]]:
    """`--grid a=1,2 --grid b=x,y` → every combination as {key: value}, in the order given."""
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not vals:
            raise UsageError(f"bad --grid {item!r}: expected KEY=V1,V2,…, e.g. --grid max_num_seqs=8,256")
        axes.append((key.strip(), vals))
    return [dict(zip([k for k, _ in axes], combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]


def grid_dir_name(values: dict[str, str]) -> str:
    return "serve-" + ",".join(f"{k}={v}" for k, v in values.items()) if values else "serve"


def run_grid(args: argparse.Namespace, replay_args: list[str], *, mode: str, flag: str, xs: Sequence[float],
             argv: list[str]) -> int:
    """One sweep per grid point against `--serve-cmd` started for it; a failing point is recorded and
    the rest go on; DIR/grid.json lists every point (status, command, capacity, knee, log tail)."""
    if any(a.split("=", 1)[0] == "--target" for a in replay_args):
        raise UsageError("--target is set by --serve-cmd (http://127.0.0.1:{port}); drop --target")
    points = parse_grid(args.grid)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    serve_cmd.render(args.serve_cmd, {"port": "0", **points[0]})  # a bad template stops before any server
    grid_file = out / "grid.json"
    previous = {g["dir"]: g for g in json.loads(grid_file.read_text())["points"]} if args.resume and grid_file.exists() else {}
    rows: list[dict[str, object]] = []
    for values in points:
        name = grid_dir_name(values)
        if previous.get(name, {}).get("status") == "ok" and (out / name / "sweep.json").exists():
            print(f"sweep: {name}: done before, skipped (--resume)", flush=True)
            rows.append(previous[name])
            continue
        port = free_port()
        argv_srv = serve_cmd.render(args.serve_cmd, {"port": str(port), **values})
        recorded = redact(argv_srv)  # what grid.json, the console and the runs' labels show
        shown = shlex.join(recorded)
        row: dict[str, object] = {"dir": name, "grid": values, "command": recorded, "status": "ok"}
        (out / name).mkdir(parents=True, exist_ok=True)
        print(f"sweep: {name}: starting {shown}", flush=True)
        try:
            with serve_cmd.serve(argv_srv, port, out / name / "server.log", ready_timeout_s=args.ready_timeout) as url:
                labels = ["--label", f"serve_cmd={shown}"]
                labels += [a for k, v in values.items() for a in ("--label", f"grid.{k}={v}")]
                r_args = [*replay_args, "--target", url, *labels]
                sweep = run_sweep(r_args, replay_cli.parser().parse_args(r_args), mode=mode, flag=flag, xs=xs,
                                  out=out / name, attainment=args.attainment, refine=args.refine,
                                  verbose=args.replay_output, command=["slogate", "sweep", *argv])
            row.update(knee=sweep.knee, max_x_meeting_slo=sweep.max_x_meeting_slo)
        except serve_cmd.ServerFailed as exc:
            row.update(status="failed", error=str(exc), log_tail=exc.tail)
        except UsageError as exc:
            row.update(status="failed", error=str(exc), log_tail=serve_cmd.tail(out / name / "server.log"))
        if row["status"] != "ok":
            print(f"sweep: {name}: FAILED: {row['error']}", flush=True)
        rows.append(row)
        grid_file.write_text(json.dumps({"serve_cmd": redact(["--serve-cmd", args.serve_cmd])[1], "mode": mode,
                                         "points": rows}, indent=2) + "\n")
    for row in rows:
        best = row.get("max_x_meeting_slo")
        print(f"{row['dir']}: {row['status']}" + (f", largest {mode} meeting the SLO: {best}" if row["status"] == "ok"
                                                  else f": {row.get('error')}"))
    print(f"wrote {grid_file}")
    return 0 if any(r["status"] == "ok" for r in rows) else 1


def run_sweep(replay_args: Sequence[str], replay_ns: argparse.Namespace, *, mode: str, flag: str, xs: Sequence[float],
              out: Path, attainment: float, refine: int, verbose: bool = False, command: Sequence[str] = ()) -> Sweep:
    """Run every point (then `refine` bisection points), writing out/point-<x>/ and out/sweep.json.

    `replay_args` are the `slogate replay` options as given (recorded in each run's command),
    `replay_ns` the same parsed."""
    out.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(mode=mode, attainment_target=attainment, command=redact(list(command)))

    def point(x: float, refined: bool = False) -> None:
        p, results = run_point(replay_args, replay_ns, flag, x, out, verbose=verbose, refined=refined)
        sweep.points.append(p)
        if len(sweep.points) == 1:
            _slo_of(sweep, results)
        _save(sweep, out)

    for x in xs:
        point(x)
    for _ in range(refine):
        x = next_refine_x(sweep.points, attainment)
        if x is None or any(abs(p.x - x) < 1e-9 for p in sweep.points):
            break
        if mode == "concurrency":
            x = float(round(x))
            if any(p.x == x for p in sweep.points):
                break
        point(x, refined=True)
    return _save(sweep, out)


def run_point(replay_args: Sequence[str], replay_ns: argparse.Namespace, flag: str, x: float, out: Path, *,
              verbose: bool = False, refined: bool = False) -> tuple[SweepPoint, Results]:
    """One `slogate replay` run in memory (replay.cli.replay.run_and_write): out/point-<x>/ holds its files."""
    name = point_dir_name(x)
    directory = out / name
    directory.mkdir(parents=True, exist_ok=True)
    value = str(int(x)) if flag == "--concurrency" else sweep_io.x_text(x)
    ns = argparse.Namespace(**vars(replay_ns))
    setattr(ns, flag[2:], int(value) if flag == "--concurrency" else float(value))
    ns.out = str(directory)
    print(f"sweep: {flag[2:]}={value} → {directory}", flush=True)
    try:
        with open(directory / "replay.log", "w") as log, _quiet(log, verbose):
            workload, options = replay_cli.plan(ns, command=["slogate", "replay", *replay_args, flag, value,
                                                               "--out", str(directory)])
            results = replay_cli.run_and_write(workload, options, console=not ns.quiet).results
    except SystemExit as stop:  # the replay was interrupted (Ctrl-C/SIGTERM) and wrote its partial results
        print(f"sweep: interrupted at {flag[2:]}={value}; {out / 'sweep.json'} holds the points that finished, "
              f"{directory} the partial run (not a point of the curve)", flush=True)
        raise stop
    point = point_from_results(x, name, results, refined=refined)
    att = "–" if point.slo_attainment is None else f"{point.slo_attainment:.1%}"
    print(f"sweep: {flag[2:]}={value}: {point.request_rate_rps:.3g} req/s, {point.output_tokens_per_s:.4g} tok/s, "
          f"attainment {att}" + (f", {point.failed} failed" if point.failed else "")
          + (" (degraded)" if point.degraded else ""), flush=True)
    return point, results


@contextlib.contextmanager
def _quiet(log, verbose: bool):  # type: ignore[no-untyped-def]
    if verbose:
        yield
        return
    with contextlib.redirect_stdout(log):
        yield


def _save(sweep: Sweep, out: Path) -> Sweep:
    analyze(sweep)
    sweep_io.dump(sweep, out / "sweep.json")
    return sweep


def _slo_of(sweep: Sweep, res: Results) -> None:
    """The SLO attainment was measured with (from the first point's results), for the report's line."""
    name = res.summary.slo
    spec = res.environment.slo.get(name) if name else None
    if spec:
        sweep.slo = spec
        with contextlib.suppress(SloError):
            sweep.slo_ttft_s = parse_slo(spec).ttft


def print_table(sweep: Sweep, out: Path) -> None:
    header = [sweep.mode, "req/s", "out tok/s", "goodput/s", "attain", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", ""]
    rows = [header]
    for p in sweep.points:
        mark = ", ".join(m for m, on in (("knee", p.x == sweep.knee), ("max≥target", p.x == sweep.max_x_meeting_slo),
                                          ("refined", p.refined), ("degraded", p.degraded),
                                          (f"{p.failed} failed", p.failed > 0)) if on)
        rows.append([f"{p.x:g}", f"{p.request_rate_rps:.3g}", f"{p.output_tokens_per_s:.4g}", f"{p.goodput_rps:.3g}",
                     "–" if p.slo_attainment is None else f"{p.slo_attainment:.1%}",
                     *(_ms(v) for v in (p.ttft_p50_s, p.ttft_p99_s, p.tpot_p50_s, p.tpot_p99_s)), mark])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    knee = f"{sweep.mode} {sweep.knee:g}" if sweep.knee is not None else "not reached in this range"
    best = f"{sweep.mode} {sweep.max_x_meeting_slo:g}" if sweep.max_x_meeting_slo is not None else "none"
    print(f"knee: {knee}   (latencies in ms; {sweep_io.KNEE_RULE})")
    print(f"largest {sweep.mode} with SLO attainment ≥ {sweep.attainment_target:.0%}: {best}   SLO: {sweep.slo or 'none'}")
    print(f"wrote {out / 'sweep.json'}  (slogate report {out} -o sweep.html)")


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.4g}"
