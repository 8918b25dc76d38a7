"""The replay side's command-line modules, one per subcommand: replay, compare, sweep, report, merge.

Each exposes `main(argv) -> int` for `slogate/cli.py`; shared argparse helpers live in `args`.
They parse options and print; they never hold measurement or comparison logic.
"""
