"""Packaging: one import package (`slogate`), every source folder listed, no top-level `traces`/`replay`.

PyPI has distributions named `traces` and `replay`; slogate installed beside them must leave all
three importable. The venv test installs real wheels from the package index cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _source_packages() -> set[str]:
    """Every folder with an __init__.py under the mapped folders, as its installed dotted name."""
    mapping = PROJECT["tool"]["setuptools"]["package-dir"]
    names = set()
    for dotted, folder in mapping.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            names.add(".".join((dotted, *rel)))
    return names


def test_every_package_is_listed():
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    assert _source_packages() == listed
    assert all(name == "slogate" or name.startswith("slogate.") for name in listed)


def test_one_version_source():
    import slogate

    assert PROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PROJECT["project"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "slogate.__version__"}
    out = subprocess.run([sys.executable, "-m", "slogate", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"slogate {slogate.__version__}"


def test_direct_imports_are_declared():
    """Every third-party module the sources import is a declared dependency (core or an extra)."""
    import ast

    declared = " ".join(PROJECT["project"]["dependencies"]
                        + [d for deps in PROJECT["project"]["optional-dependencies"].values() for d in deps]).lower()
    dist_of = {"yaml": "pyyaml", "prometheus_client": "prometheus-client", "llama_cpp": "llama-cpp-python"}
    stdlib = set(sys.stdlib_module_names) | {"slogate"}
    missing = set()
    for folder in PROJECT["tool"]["setuptools"]["package-dir"].values():
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                         else [])
                for name in names:
                    top = name.split(".")[0]
                    if top not in stdlib and dist_of.get(top, top).replace("_", "-") not in declared:
                        missing.add(f"{top} ({path.relative_to(REPO)})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


@pytest.mark.slow
def test_installs_beside_pypi_traces_and_replay(tmp_path):
    """A venv with PyPI's `traces` and `replay` plus slogate: all three import, and `import traces`
    is PyPI's, not slogate's."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "traces", "replay"], check=True, timeout=600)
    # A copy of the sources (setuptools builds in the source folder); --no-deps + the running venv's
    # site-packages on the path: no second download of slogate's dependencies.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", ".*cache",
                                                             ".hypothesis", "__pycache__"))
    subprocess.run([*pip, "--no-deps", str(src)], check=True, timeout=600, cwd=tmp_path)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    code = (f"import sys; sys.path.append({site!r})\n"
            "import traces, replay, slogate.traces.record, slogate.gateway.relay, slogate.replay.cli.replay\n"
            "assert 'slogate' not in (traces.__file__ or ''), traces.__file__\n"
            "assert 'slogate' not in (replay.__file__ or ''), replay.__file__\n"
            "import importlib.util\n"
            "assert importlib.util.find_spec('gateway') is None\n"
            "print('ok')\n")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
