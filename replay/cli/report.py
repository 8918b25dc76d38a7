"""`slogate report DIR... -o report.html`: one self-contained HTML report of runs and sweeps.

Only parses arguments and maps user mistakes to UsageError; the work is in replay.report.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from slogate.replay import report
from slogate.replay.report import PLOTS_HINT, ReportError, write_report
from slogate.traces.usage import UsageError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slogate report",
        description="Write one self-contained HTML file (no remote assets) with the environment, the summary, "
        "TTFT/TPOT/E2E CDFs, a timeline per run and, for sweep directories, the throughput–latency curve.",
        epilog="examples:\n  slogate report runs/a100 runs/h100 -o report.html\n  slogate report sweeps/h100 -o sweep.html\n"
        "  slogate report captures/prod runs/h100 -o prod-vs-h100.html   # a gateway capture beside a candidate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directory (results.json …), sweep directory (sweep.json), or a captured trace "
                   "(capture directory or .jsonl.zst)")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        path = write_report(args.dirs, args.output, plots=not args.no_plots)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    extra = "" if args.no_plots or report.plots_available() else f" (tables only; {PLOTS_HINT})"
    print(f"wrote {path}{extra}")
    return 0
