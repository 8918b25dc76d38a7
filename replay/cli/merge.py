"""`slogate merge DIR... -o DIR`: combine the shard results of a distributed replay into one.

Argument parsing and output only; the merge itself is replay.merge. User mistakes raise UsageError.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slogate.traces.usage import UsageError

EXAMPLES = """examples:
  # three shards started at the same wall-clock time on three machines, then merged
  slogate merge runs/shard0 runs/shard1 runs/shard2 -o runs/merged
"""


def main(argv: list[str] | None = None) -> int:
    from slogate.replay.cli.args import Parser

    p = Parser(prog="slogate merge", description="Merge shard results (results.json + "
                                "requests.jsonl.zst) of a distributed replay; percentiles are recomputed from "
                                "the merged per-request records.", epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", help="shard result directories")
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.add_argument("--quiet", action="store_true", help="no console table")
    ns = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    from slogate.replay.cli.replay import write_outputs
    from slogate.replay.merge import merge_dirs

    merged = merge_dirs(ns.dirs)  # first: a bad input is named before a bad output
    out = Path(ns.out)
    check_out(out, ns.dirs)
    write_outputs(merged, out, console=not ns.quiet)
    return 0


def check_out(out: Path, dirs: list[str]) -> None:
    """Refuse an output that would overwrite an input (the same directory or one inside it) or that
    cannot be a directory (an existing file, or a file where a parent directory should be)."""
    from slogate.replay.cli.args import output_dir

    output_dir(out, "-o")
    target = out.resolve()
    for d in dirs:
        src = Path(d).resolve()
        if target == src or src in target.parents:
            where = "the input" if target == src else "inside the input"
            raise UsageError(f"-o {out} is {where} {d}, which a merge must not change; write the merged run to "
                             "a new directory outside the inputs")
