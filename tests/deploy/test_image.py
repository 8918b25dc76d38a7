"""The image recipe: deploy/Dockerfile, its ignore file and the constraints file it installs with.

Read-only checks (no Docker daemon or registry here): the base image is pinned by digest, the OCI
labels are set from build arguments, and deploy/constraints.txt pins every runtime dependency.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import slogate
from tests.deploy.deployfiles import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"
CONSTRAINTS = DEPLOY / "constraints.txt"
DIGEST_REF = re.compile(r"^python:3\.11-slim@sha256:[0-9a-f]{64}$")
OCI_LABELS = {"title", "description", "source", "licenses", "version", "revision", "created"}
# The extras the images are built with (EXTRAS="" and EXTRAS=replay).
IMAGE_EXTRAS = ("", "replay")


def _text() -> str:
    return DOCKERFILE.read_text()


def _joined() -> str:
    return re.sub(r"\\\n", " ", _text())


def _args() -> dict[str, str]:
    return dict(re.findall(r"^ARG ([A-Z_]+)=(.*)$", _text(), re.M))


def constraints() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"{CONSTRAINTS.name}: {line!r} is not NAME==VERSION"
        name = canonicalize_name(m[1])
        assert name not in pins, f"{CONSTRAINTS.name}: {name} pinned twice"
        pins[name] = m[2]
    return pins


def runtime_requirements() -> list[Requirement]:
    """Every requirement on the way from slogate (with the image extras) to its leaves, as declared
    by the installed distributions' metadata, markers evaluated for this Python (the image's 3.11)."""
    out: list[Requirement] = []
    seen: set[str] = set()
    todo = [("slogate", IMAGE_EXTRAS)]
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
                out.append(req)
                todo.append((canonicalize_name(req.name), ("",)))
    return out


def test_base_image_pinned_by_digest() -> None:
    ref = _args()["PYTHON_IMAGE"]
    assert DIGEST_REF.match(ref), f"ARG PYTHON_IMAGE={ref}: expected python:3.11-slim@sha256:<64 hex digits>"
    froms = re.findall(r"^FROM (\S+)", _text(), re.M)
    assert froms and all(f == "${PYTHON_IMAGE}" for f in froms), f"every stage starts from ARG PYTHON_IMAGE: {froms}"


def test_oci_labels_from_build_args() -> None:
    labels = dict(re.findall(r'org\.opencontainers\.image\.([a-z]+)="([^"]*)"', _joined()))
    assert set(labels) == OCI_LABELS, set(labels) ^ OCI_LABELS
    args = _args()
    for key in ("version", "revision", "created", "source"):
        assert labels[key] == "${" + key.upper() + "}", f"label {key} must come from ARG {key.upper()}"
        assert key.upper() in args
    assert args["VERSION"] == slogate.__version__, (
        f"ARG VERSION={args['VERSION']} but slogate.__version__ is {slogate.__version__}: update deploy/Dockerfile"
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert labels["licenses"] == project["license"]
    assert labels["title"] == project["name"] and labels["description"] == project["description"]
    # The labels come after the last RUN/COPY: build-dependent values must not invalidate the layer cache.
    last_layer = max(m.start() for m in re.finditer(r"^(RUN|COPY) ", _text(), re.M))
    assert _text().index("LABEL ") > last_layer


def test_constraints_pin_every_runtime_dependency() -> None:
    """deploy/constraints.txt pins each distribution the image installs, at a version the declared
    ranges accept; nothing else (a stale pin would make `pip install -c` silently ignore it)."""
    pins = constraints()
    reqs = runtime_requirements()
    needed = {canonicalize_name(r.name) for r in reqs}
    for core in ("aiohttp", "uvloop", "orjson", "msgspec", "zstandard", "prometheus-client", "multidict", "yarl"):
        assert core in needed, core
    assert needed - set(pins) == set(), f"add to deploy/constraints.txt: {sorted(needed - set(pins))}"
    assert set(pins) - needed == set(), f"not installed in the image: {sorted(set(pins) - needed)}"
    for req in reqs:
        pin = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(pin, prereleases=True), f"{req.name}=={pin} does not satisfy {req}"


def test_dockerfile_installs_with_constraints() -> None:
    text, joined = _text(), _joined()
    assert re.search(r"^COPY deploy/constraints\.txt \./constraints\.txt$", text, re.M)
    assert re.search(r"pip install --no-cache-dir -c constraints\.txt \"\.\$\{EXTRAS:\+\[\$EXTRAS\]\}\"", joined)
    assert re.search(r'^ARG EXTRAS=""$', text, re.M), "the default image has core dependencies only"
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert re.search(r"^EXPOSE 8080 9090$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*CMD \[\"python\", \"-c\", \".*urllib\.request.*/healthz", joined, re.M)
    assert re.search(r'^ENTRYPOINT \["slogate"\]$', text, re.M)
    assert re.search(r'^CMD \["gateway",', joined, re.M)


def test_everything_copied_is_in_the_context() -> None:
    """Everything the build COPYs exists in the context and is not excluded by the ignore file;
    `pip install .` needs every package the distribution ships and the readme pyproject names."""
    text = _text()
    ignored = {line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = set()
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        for src in line.split()[:-1]:
            assert (REPO / src).exists(), f"COPY {src}: not in the build context"
            top = src.split("/", 1)[0]
            assert src.rstrip("/") not in ignored and top not in ignored, f"COPY {src}: excluded by Dockerfile.dockerignore"
            copied.add(src.rstrip("/"))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(project["tool"]["setuptools"]["package-dir"].values())
    assert packages and packages | {"pyproject.toml", project["project"]["readme"]} <= copied, (
        f"the Dockerfile must COPY {sorted(packages - copied)}"
    )
