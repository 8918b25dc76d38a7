"""The `slogate` command: a thin dispatcher from subcommand to the module that owns it.

Each subcommand's module is imported only when that subcommand runs, so `slogate gateway`
loads no replay or simulator code. Never imports a subcommand's module before it runs.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from slogate.traces.usage import UsageError

# subcommand -> (module, one-line summary). Each module exposes `main(argv) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("slogate.traces.trace_cli", "inspect, validate and convert trace files (slogate, Mooncake, Azure, BurstGPT)"),
    "sim": ("slogate.replay.sim.cli", "simulated continuous-batching LLM engine behind the OpenAI API"),
    "gateway": ("slogate.gateway.cli", "sidecar proxy: relay, measure, export goodput metrics, capture traces"),
    "epp": ("slogate.gateway.epp.cli", "endpoint picker for Envoy (ext_proc gRPC): route, measure and capture behind Envoy"),
    "replay": ("slogate.replay.cli.replay", "replay a trace against a target and report throughput, goodput, latency"),
    "compare": ("slogate.replay.cli.compare", "compare two or more replay results; exit 1 when a bound is broken"),
    "sweep": ("slogate.replay.cli.sweep", "run a replay per speed/rate/concurrency point and find the knee"),
    "plan": ("slogate.replay.cli.plan", "which GPU, flags and replicas meet the SLO at what cost, from one trace (virtual time)"),
    "report": ("slogate.replay.cli.report", "write a self-contained HTML report of one or more runs"),
    "merge": ("slogate.replay.cli.merge", "merge shard results of a distributed replay"),
    "demo": ("slogate.replay.demo.main", "the whole loop on a simulated upstream and a bundled real trace"),
}

def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: slogate <subcommand> [options]   (slogate <subcommand> --help for details)", ""]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    return "\n".join(lines)

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from slogate import __version__

        print(f"slogate {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"slogate: unknown subcommand {name!r}; choose one of: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"slogate: subcommand {name!r} is not available in this install ({exc.name} missing)", file=sys.stderr)
            return 2
        raise
    try:
        try:
            status = int(module.main(rest) or 0)
        finally:  # also after --help's SystemExit: a reader that left is handled below, not in Python's exit
            sys.stdout.flush()
        return status
    except UsageError as exc:
        print(f"slogate {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `slogate compare … | head`: the reader left; stop quietly, as `cat` does
        _silence_stdout()
        return 128 + signal.SIGPIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so Python's flush at exit does not raise into a traceback again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an in-process caller's capture)
        pass

if __name__ == "__main__":
    sys.exit(main())
