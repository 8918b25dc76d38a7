"""Which build of each compiled group runs: mypyc-compiled (`make compile`, setup.py) or pure Python.

A group (the simulator's hot modules; the gateway's data path) is used compiled only when every module
matches the source it was built from (the group's stamp, _native.json beside its library) and nothing
else compiled lies beside them; otherwise, or with SLOGATE_PURE=1, all of its modules load from their
.py files, so an edited source is never shadowed by a stale build. Results are the same either way.
Imports only the standard library (setup.py reads GROUPS from this file); never builds.
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

SIM = "slogate.replay.sim._native"
GATEWAY = "slogate.gateway._native"
# group library -> (what it is, in a warning; the modules it compiles). Module names as installed.
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    SIM: ("simulator", tuple(f"slogate.replay.sim.{m}" for m in ("kvcache", "steptime", "scheduler", "engine"))),
    # the relay's per-request and per-chunk path. Left out: modules whose msgspec.Structs are decoded
    # (mypyc keeps no union or generic annotation, which msgspec reads): traces.metrics, traces.request_info,
    # routing.upstreams and routing.health (and routing.shared_state, which subclasses UpstreamState)
    GATEWAY: ("gateway", (
        *(f"slogate.gateway.{m}" for m in ("http_server", "upstream_conn", "streaming", "exchange", "relay",
                                           "recorder", "live_metrics", "status", "capture", "headers", "timeouts",
                                           "overhead", "assemble", "upstream")),
        "slogate.gateway.routing.router",
        *(f"slogate.traces.{m}" for m in ("observer", "http1", "histogram")))),
}
STAMP = "_native.json"
_selected: dict[str, str] = {}


def package_dir(package: str) -> Path:
    """The folder of an installed package name (`slogate.gateway.routing`), in the source tree or a wheel.
    Looks up only the first-level package (its parent, `slogate`, is already imported)."""
    parts = package.split(".")
    spec = importlib.util.find_spec(".".join(parts[:2]))
    if spec is None or not spec.submodule_search_locations:  # a checkout's slogate/ without the install
        raise ImportError(f"slogate: {package} is not installed in {sys.executable}: run `make install` "
                          f"(or `pip install -e .`) and use that Python")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts[2:])


def source(module: str) -> Path:
    package, _, name = module.rpartition(".")
    return package_dir(package) / f"{name}.py"


def _compiled_files(group: str) -> dict[str, str]:
    """module -> its compiled file name, for every compiled file in the group's folders (the group
    library aside): a module an older build compiled shows up here too."""
    folders = {m.rpartition(".")[0] for m in GROUPS[group][1]}
    out = {}
    for package in folders:
        for path in package_dir(package).glob("*.so"):
            name = path.name.split(".")[0]
            if not name.endswith("__mypyc"):
                out[f"{package}.{name}"] = path.name
    return out


def stale(group: str) -> str | None:
    """Why the group's compiled build must not be used (None: it may)."""
    modules = GROUPS[group][1]
    short = {m: m.rpartition(".")[2] for m in modules}
    stamp_path = package_dir(group.rpartition(".")[0]) / STAMP
    try:
        stamp = json.loads(stamp_path.read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its build stamp {STAMP} is missing or unreadable"
    built = sorted(_compiled_files(group))
    if built != sorted(modules) or sorted(stamp) != sorted(modules):
        names = ", ".join(sorted(m.rpartition(".")[2] for m in built))
        return f"it holds {names}, where this source compiles {', '.join(sorted(short.values()))}"
    for module in modules:
        try:
            now = hashlib.sha256(source(module).read_bytes()).hexdigest()
        except OSError:
            return None  # an installed build without its sources: nothing to be stale against
        if stamp.get(module) != now:
            return f"{short[module]}.py changed since it was compiled"
    return None


class _Sources(importlib.abc.MetaPathFinder):
    """Finds the listed modules as their .py files, ahead of any compiled file beside them."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname))


def select(group: str) -> str:
    """'mypyc' or 'python': which build of the group this process runs (decided once, before any of its
    modules is imported: by the package that holds them all)."""
    if group in _selected:
        return _selected[group]
    what, modules = GROUPS[group]
    lib = package_dir(group.rpartition(".")[0])
    build = "python"
    if any(lib.glob(f"{group.rpartition('.')[2]}__mypyc.*")):
        why = None if os.environ.get("SLOGATE_PURE", "") not in ("", "0") else stale(group)
        if why is None and os.environ.get("SLOGATE_PURE", "") in ("", "0"):
            build = "mypyc"
        else:
            if why is not None:
                warnings.warn(f"slogate: the compiled {what} is stale ({why}); running pure Python. Rebuild it "
                              f"with `make compile`, or remove its *.so files", RuntimeWarning, stacklevel=3)
            sys.meta_path.insert(0, _Sources({*modules, *_compiled_files(group)}))
    _selected[group] = build
    return build
