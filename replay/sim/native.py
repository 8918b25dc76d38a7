"""Which build of the simulator's hot modules runs: mypyc-compiled (`make compile`) or pure Python.

The compiled modules are used only when every one matches the source it was built from (the build's
stamp, _native.json); otherwise, or with SLOGATE_PURE=1, all of them load from their .py files, so an
edited source is never shadowed by a stale build. Results are the same either way. Never builds.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

COMPILED = ("kvcache", "steptime", "scheduler", "engine")  # what setup.py compiles (it reads this tuple)
PACKAGE = __name__.rpartition(".")[0]
HERE = Path(__file__).resolve().parent


def _built() -> list[str]:
    """Modules with a compiled file here (the group library aside)."""
    return sorted({p.name.split(".")[0] for p in HERE.glob("*.so")} - {"_native__mypyc"})


def _stale() -> str | None:
    """Why the compiled build must not be used (None: it may)."""
    try:
        stamp = json.loads((HERE / "_native.json").read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its build stamp _native.json is missing or unreadable"
    if _built() != sorted(COMPILED) or sorted(stamp) != sorted(COMPILED):
        return f"it holds {', '.join(_built())}, where this source compiles {', '.join(COMPILED)}"
    for name in COMPILED:
        try:
            now = hashlib.sha256((HERE / f"{name}.py").read_bytes()).hexdigest()
        except OSError:
            return None  # an installed build without its sources: nothing to be stale against
        if stamp.get(name) != now:
            return f"{name}.py changed since it was compiled"
    return None


class _Sources(importlib.abc.MetaPathFinder):
    """Finds the listed modules as their .py files, ahead of any compiled file beside them."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname.rpartition(".")[0] != PACKAGE or fullname.rpartition(".")[2] not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{fullname.rpartition('.')[2]}.py")


def _load_pure() -> None:
    """Import every compiled module, and any left over from another build, from its source (in any
    order: a module's own imports of the others find their sources too)."""
    names = {*COMPILED, *_built()}
    finder = _Sources(names)
    sys.meta_path.insert(0, finder)
    try:
        for name in sorted(names):
            importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.meta_path.remove(finder)


def select() -> str:
    """'mypyc' or 'python': which build this process runs (called once, by the package's __init__)."""
    if not any(HERE.glob("_native__mypyc.*")):
        return "python"
    if os.environ.get("SLOGATE_PURE", "") not in ("", "0"):
        _load_pure()
        return "python"
    why = _stale()
    if why is None:
        return "mypyc"
    warnings.warn(f"slogate: the compiled simulator is stale ({why}); running pure Python. "
                  "Rebuild it with `make compile`, or remove replay/sim/*.so", RuntimeWarning, stacklevel=2)
    _load_pure()
    return "python"
