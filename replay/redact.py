"""Secrets out of the command lines that results, sweeps, grids and plans record.

`redact` keeps every argument but the values of `--api-key`, `--hf-token` and `--header`/`-H`
(the header's name stays, its value goes), Authorization and Bearer values anywhere, and the same
inside a `--serve-cmd` string. Pure: never reads or writes anything.
"""

from __future__ import annotations

import shlex

MASK = "***"
_VALUE_FLAGS = frozenset({"--api-key", "--hf-token"})  # the whole value is the secret
_HEADER_FLAGS = frozenset({"--header", "-H"})  # K:V, the value is the secret
_COMMAND_FLAGS = frozenset({"--serve-cmd"})  # a whole command line in one argument


def redact(command: list[str]) -> list[str]:
    """The command line with every secret value replaced by ***."""
    out: list[str] = []
    pending: str | None = None  # the flag whose value is the next argument
    for arg in command:
        if pending is not None:
            out.append(_value(pending, arg))
            pending = None
            continue
        flag, eq, value = arg.partition("=")
        if flag in _VALUE_FLAGS | _HEADER_FLAGS | _COMMAND_FLAGS:
            if eq:
                out.append(f"{flag}={_value(flag, value)}")
            else:
                out.append(arg)
                pending = arg
            continue
        out.append(_header(arg) if _looks_secret(arg) else arg)
    return out


def _value(flag: str, value: str) -> str:
    if flag in _HEADER_FLAGS:
        return _header(value)
    if flag in _COMMAND_FLAGS:
        try:
            return shlex.join(redact(shlex.split(value)))
        except ValueError:  # unbalanced quotes: nothing can be kept safely
            return MASK
    return MASK


def _header(text: str) -> str:
    """`Name: value` → `Name:***` (a header without a name is masked whole)."""
    name, sep, _ = text.partition(":")
    return f"{name}:{MASK}" if sep and name.strip() else MASK


def _looks_secret(arg: str) -> bool:
    low = arg.lower()
    return low.startswith(("authorization:", "authorization=")) or "bearer " in low
