"""Build hook: with SLOGATE_COMPILE=1 the simulator's hot modules are compiled with mypyc.

Everything else about the package is in pyproject.toml; without the variable this adds nothing and
the install stays pure Python (the default, and the fallback at import: replay/sim/native.py).
`make compile` runs it in place: `SLOGATE_COMPILE=1 python setup.py build_ext --inplace`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SIM = HERE / "replay" / "sim"
COMPILED = ("kvcache", "steptime", "scheduler", "engine")  # replay/sim/<name>.py; the same tuple as native.COMPILED
GROUP = "slogate.replay.sim._native"  # one shared library, inside the package (not at the top level)
# what the compiled modules may import, laid out as installed (mypy names a module after its folders,
# and the source tree maps replay/ onto slogate.replay); mypy reads only what they do import
COPIED = {"slogate": "*.py", "replay": "__init__.py", "replay/sim": "*.py", "traces": "**/*.py"}


def extensions() -> list:
    if os.environ.get("SLOGATE_COMPILE", "0") in ("", "0"):
        return []
    from mypyc.build import mypycify

    src = HERE / "build" / "mypyc-src"
    shutil.rmtree(src, ignore_errors=True)
    for folder, pattern in COPIED.items():
        for path in (HERE / folder).glob(pattern):
            dest = src / "slogate" / path.relative_to(HERE / "slogate" if folder == "slogate" else HERE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    # the stamp: what the build compiled, by source hash (native.py loads pure Python on a mismatch)
    stamp = {m: hashlib.sha256((SIM / f"{m}.py").read_bytes()).hexdigest() for m in COMPILED}
    (SIM / "_native.json").write_text(json.dumps({"compiler": "mypyc", "sources": stamp}, indent=1) + "\n")
    return mypycify([str(src / "slogate" / "replay" / "sim" / f"{m}.py") for m in COMPILED], group_name=GROUP,
                    opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"), target_dir=str(HERE / "build" / "mypyc"))


setup(ext_modules=extensions())
