"""Display names for runs shown side by side (`slogate compare` columns, `slogate report` sections).

Two inputs may end in the same directory name; the repeats get `#2`, `#3`, … so every column and
section stays distinguishable. Pure: renames in place, never reads files.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Named(Protocol):
    name: str


def number_repeated_names(items: Iterable[Named]) -> None:
    """Rename the second and later items of a repeated name to `NAME#2`, `NAME#3`, …, in order."""
    seen: dict[str, int] = {}
    for item in items:
        n = seen.get(item.name, 0)
        seen[item.name] = n + 1
        if n:
            item.name = f"{item.name}#{n + 1}"
