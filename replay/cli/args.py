"""argparse helpers shared by the replay side's subcommands: a parser whose mistakes are one line.

Never parses a subcommand's options itself and never prints; each subcommand module owns its flags.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from slogate.traces.usage import UsageError


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one-line `UsageError`s (exit 2), like every other slogate error."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def seconds(text: str, what: str) -> float:
    """A duration option (`5s`, `10ms`, `600`) in seconds; a malformed one is a `UsageError` naming `what`."""
    from slogate.traces.slo import SloError, parse_duration

    try:
        return parse_duration(text, what=what)
    except SloError as exc:
        raise UsageError(str(exc)) from None


def pairs(items: list[str], sep: str, what: str) -> dict[str, str]:
    """Repeated `KEY<sep>VALUE` options as a dict; a malformed one is a `UsageError` naming `what`."""
    out: dict[str, str] = {}
    for item in items:
        if sep not in item:
            raise UsageError(f"bad {what} {item!r}: expected KEY{sep}VALUE")
        k, v = item.split(sep, 1)
        out[k.strip()] = v.strip()
    return out


def output_dir(path: Path, what: str = "--out") -> Path:
    """Check, before any work, that `path` can be the output directory: it is a directory or can be
    created as one (every existing part of it is a directory we may write in). A run must not find out
    after sending its load that it cannot write its results."""
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{what} {path} exists and is not a directory: give a new or existing directory")
        probe_in = path
    else:
        probe_in = path.parent
        while not probe_in.exists():
            probe_in = probe_in.parent
        if not probe_in.is_dir():
            raise UsageError(f"{what} {path}: {probe_in} is a file, not a directory: give another path")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".slogate-probe-", dir=probe_in))
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write in {probe_in} ({exc.strerror}): give a writable path") from None
    return path
