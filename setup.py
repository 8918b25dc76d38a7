"""Build hook: with SLOGATE_COMPILE=1 the hot modules (the simulator's, the gateway's data path) are
compiled with mypyc, one shared library per group (slogate/native.py's GROUPS).

Everything else about the package is in pyproject.toml; without the variable this adds nothing and
the install stays pure Python (the default, and the fallback at import: slogate/native.py).
`make compile` runs it in place: `SLOGATE_COMPILE=1 python setup.py build_ext --inplace`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# the source tree's folders as installed (pyproject.toml's package-dir)
FOLDERS = {"slogate": HERE / "slogate", "traces": HERE / "traces", "gateway": HERE / "gateway", "replay": HERE / "replay"}
STAMPS: dict[str, dict[str, str]] = {}  # group -> {module: sha256 of the source this build compiles}


def _native():
    """slogate/native.py, read from its file (the package itself need not be importable while it is built)."""
    spec = importlib.util.spec_from_file_location("_slogate_native", HERE / "slogate" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree_path(module: str) -> Path:
    """`slogate.gateway.routing.router` -> gateway/routing/router.py (or a package's folder, without .py)."""
    parts = module.split(".")[1:]
    return FOLDERS[parts[0]].joinpath(*parts[1:]) if parts[0] in FOLDERS and len(parts) > 1 else FOLDERS[parts[0]]


class StampedBuildExt(build_ext):
    """build_ext, then each group's stamp: its modules' source hashes (slogate/native.py uses a build only
    while they match). Written only once the build succeeded, so a failed rebuild leaves none."""

    def run(self) -> None:
        super().run()
        for group, sources in STAMPS.items():
            text = json.dumps({"compiler": "mypyc", "sources": sources}, indent=1) + "\n"
            package = group.rpartition(".")[0]
            _tree_path(package).joinpath(_native().STAMP).write_text(text)  # in place (make compile, editable)
            built = Path(self.build_lib).joinpath(*package.split("."))
            if not self.inplace and built.is_dir():  # a wheel
                (built / _native().STAMP).write_text(text)


def extensions() -> list:
    if os.environ.get("SLOGATE_COMPILE", "0") in ("", "0"):
        return []
    from mypyc.build import mypycify

    native = _native()
    for group in native.GROUPS:  # until the new build succeeds, none is trusted
        _tree_path(group.rpartition(".")[0]).joinpath(native.STAMP).unlink(missing_ok=True)
    src = HERE / "build" / "mypyc-src"  # the tree laid out as installed: mypy names a module after its folders
    shutil.rmtree(src, ignore_errors=True)
    for name, folder in FOLDERS.items():
        dest = src / "slogate" if name == "slogate" else src / "slogate" / name
        shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.json", "samples"))
    out = []
    for group, (_, modules) in native.GROUPS.items():
        paths = [src.joinpath(*m.split(".")[:-1], m.split(".")[-1] + ".py") for m in modules]
        STAMPS[group] = {m: hashlib.sha256(p.read_bytes()).hexdigest() for m, p in zip(modules, paths, strict=True)}
        out += mypycify([str(p) for p in paths], group_name=group, opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"),
                        target_dir=str(HERE / "build" / "mypyc" / group.split(".")[1]))
    return out


setup(ext_modules=extensions(), cmdclass={"build_ext": StampedBuildExt})
