"""Build hook: with SLOGATE_COMPILE=1 the simulator's hot modules are compiled with mypyc.

Everything else about the package is in pyproject.toml; without the variable this adds nothing and
the install stays pure Python (the default, and the fallback at import: replay/sim/native.py).
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
SIM = HERE / "replay" / "sim"
STAMP = "_native.json"
GROUP = "slogate.replay.sim._native"  # one shared library, inside the package (not at the top level)
SOURCES: dict[str, str] = {}  # module → sha256 of the source this build compiles (extensions() fills it)
# what the compiled modules may import, laid out as installed (mypy names a module after its folders,
# and the source tree maps replay/ onto slogate.replay); mypy reads only what they do import
COPIED = {"slogate": "*.py", "replay": "__init__.py", "replay/sim": "*.py", "traces": "**/*.py"}


def _compiled() -> tuple[str, ...]:
    """replay/sim/native.py's COMPILED: the one list of what is compiled (read from the file, since
    the package itself need not be importable while it is built)."""
    spec = importlib.util.spec_from_file_location("_slogate_native", SIM / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.COMPILED)


class StampedBuildExt(build_ext):
    """build_ext, then the stamp: each compiled module's source hash (native.py uses the build only
    while they match). Written only once the build succeeded, so a failed rebuild leaves none."""

    def run(self) -> None:
        super().run()
        if not SOURCES:
            return
        text = json.dumps({"compiler": "mypyc", "sources": SOURCES}, indent=1) + "\n"
        (SIM / STAMP).write_text(text)  # in place (make compile, editable installs)
        built = Path(self.build_lib) / "slogate" / "replay" / "sim"
        if not self.inplace and built.is_dir():  # a wheel
            (built / STAMP).write_text(text)


def extensions() -> list:
    if os.environ.get("SLOGATE_COMPILE", "0") in ("", "0"):
        return []
    from mypyc.build import mypycify

    (SIM / STAMP).unlink(missing_ok=True)  # until the new build succeeds, none is trusted
    src = HERE / "build" / "mypyc-src"
    shutil.rmtree(src, ignore_errors=True)
    for folder, pattern in COPIED.items():
        for path in (HERE / folder).glob(pattern):
            dest = src / "slogate" / path.relative_to(HERE / "slogate" if folder == "slogate" else HERE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    names = _compiled()
    paths = [src / "slogate" / "replay" / "sim" / f"{m}.py" for m in names]
    SOURCES.update({m: hashlib.sha256(p.read_bytes()).hexdigest() for m, p in zip(names, paths, strict=True)})
    return mypycify([str(p) for p in paths], group_name=GROUP, opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"),
                    target_dir=str(HERE / "build" / "mypyc"))


setup(ext_modules=extensions(), cmdclass={"build_ext": StampedBuildExt})
