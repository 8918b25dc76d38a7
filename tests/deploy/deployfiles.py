"""Readers for the files under deploy/: manifests, kustomizations, the rules file and the dashboard.

Shared by the tests in this package; pure functions over files, no servers. Grafana variables in
dashboard expressions are substituted here so the same PromQL can run against a real Prometheus.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBE = DEPLOY / "kubernetes"
RULES = DEPLOY / "prometheus" / "rules.yml"
PROMETHEUS_RULE = KUBE / "base" / "prometheusrule.yaml"
DASHBOARD = DEPLOY / "grafana" / "slogate-dashboard.json"
KUSTOMIZATION = "kustomization.yaml"

README = DEPLOY / "README.md"
ADAPTER_RULES = DEPLOY / "prometheus" / "prometheus-adapter.yaml"
# The files that define the gateway's metric families (names as string literals).
METRIC_SOURCES = [REPO / "gateway" / "live_metrics.py", REPO / "gateway" / "routing" / "metrics.py"]

# Kinds that come from CRDs (Prometheus Operator, KEDA): kubernetes-validate ships no schema for
# them, tests/deploy/crd_schemas.py does.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject", "InferencePool", "HTTPRoute"}
# `kubectl kustomize` must be kustomize v5 (`labels:`, inline patches): `make apt` installs one.
MIN_KUSTOMIZE_MAJOR = 5
# Grafana variables → values a plain PromQL query accepts (as Grafana would expand them for "All").
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$job": ".*", "$model": ".*", "$slo": ".*"}
METRIC_NAME = re.compile(r"\b((?:gen_ai|slogate)_[a-z0-9_]+)\b")
# Label lists and selectors, removed before looking for metric names (labels like gen_ai_token_type).
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\{[^}]*\}")


def kustomize_dirs() -> list[Path]:
    return sorted(p.parent for p in KUBE.rglob(KUSTOMIZATION))


@functools.cache
def kubectl() -> str:
    """kubectl with kustomize v5 (on PATH, as `make apt` installs it); fails the test otherwise."""
    path = shutil.which("kubectl")
    assert path, "kubectl is not installed: run `make apt` (deploy/install_kubectl.py)"
    out = subprocess.run([path, "version", "--client"], capture_output=True, text=True, timeout=30)
    m = re.search(r"Kustomize Version: v(\d+)\.", out.stdout)
    assert m and int(m[1]) >= MIN_KUSTOMIZE_MAJOR, (
        f"{path}: need kustomize v{MIN_KUSTOMIZE_MAJOR}+, got {out.stdout.strip()!r}: run `make apt`"
    )
    return path


@functools.cache
def _kustomize_build(directory: Path) -> str:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {directory}: {out.stderr}"
    return out.stdout


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIRECTORY` renders (fresh copies on every call)."""
    return [d for d in yaml.safe_load_all(_kustomize_build(directory)) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
            return doc
    raise AssertionError(f"no {kind} {name or ''} in {sorted({d['kind'] for d in docs})}")


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / KUSTOMIZATION).read_text())


def manifest_files() -> list[Path]:
    """Every file a kustomization lists under `resources` (the whole objects, not patches)."""
    out = []
    for directory in kustomize_dirs():
        for entry in kustomization(directory).get("resources", []):
            path = (directory / entry).resolve()
            if path.is_file():
                out.append(path)
    return sorted(set(out))


def rule_groups() -> list[dict[str, Any]]:
    return yaml.safe_load(RULES.read_text())["groups"]


def recording_rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "record" in r]


def alerting_rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def dashboard_queries() -> list[tuple[str, str]]:
    """(id "panel title/refId", expression with Grafana variables substituted)."""
    out = []
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            out.append((f"{panel['title']}/{target['refId']}", promql_from_grafana(target["expr"])))
    return out


def promql_from_grafana(expr: str) -> str:
    # Longest names first, so `$__rate_interval` is not split by a shorter variable.
    for var in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, GRAFANA_VARS[var]).replace("${" + var[1:] + "}", GRAFANA_VARS[var])
    return expr


def metric_names(expr: str) -> set[str]:
    """Raw gateway metric names an expression reads (recording-rule names contain ':' and are not)."""
    return set(METRIC_NAME.findall(_LABEL_LISTS.sub(" ", expr)))


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")


def dashboard_label_queries() -> list[tuple[str, str, str]]:
    """(variable name, series selector, label) of each `label_values(selector, label)` variable."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
        m = _LABEL_VALUES.match(query.strip())
        assert m, f"dashboard variable {var['name']}: expected label_values(selector, label), got {query}"
        out.append((var["name"], promql_from_grafana(m["selector"]), m["label"]))
    return out
