"""Reading a TOML config file (`--config FILE`) for any subcommand: the parsed document, or one UsageError line.

Never interprets the tables: each subcommand validates its own keys.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from slogate.traces.usage import UsageError


def read_toml_file(path: str | Path, flag: str = "--config") -> dict[str, Any]:
    """The TOML document at `path`; a missing, unreadable or invalid file is a UsageError naming it."""
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{flag} {path}: not valid TOML ({exc})") from None
