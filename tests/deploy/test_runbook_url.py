"""The alerts' runbook URL base is configurable: the runbook-url overlay's kustomize replacement and
make_prometheusrule.py --runbook-base each change every alert's base and keep its anchor."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import yaml

from tests.deploy.deployfiles import DEPLOY, KUBE, RULES, alerting_rules, find, kustomize_build

OVERLAY = KUBE / "overlays" / "runbook-url"
SCRIPT = DEPLOY / "prometheus" / "make_prometheusrule.py"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_prometheusrule", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_overlay_points_every_alert_at_the_configured_base() -> None:
    base = yaml.safe_load((OVERLAY / "runbook-url.yaml").read_text())["data"]["base"]
    docs = kustomize_build(OVERLAY)
    assert not [d for d in docs if d["metadata"]["name"] == "slogate-runbook-url"]  # local config only
    rules = [r for g in find(docs, "PrometheusRule", "slogate-rules")["spec"]["groups"] for r in g["rules"]]
    alerts = [r for r in rules if "alert" in r]
    assert len(alerts) == len(alerting_rules()) > 0
    for rule in alerts:
        assert rule["annotations"]["runbook_url"] == f"{base}#runbook-{rule['alert'].lower()}"
    assert not [r for r in rules if "record" in r and "annotations" in r]  # recording rules untouched


def test_runbook_base_rewrites_every_alert_and_only_the_base() -> None:
    script = _script()
    text = RULES.read_text()
    out = script.set_runbook_base(text, "https://code.internal/ml/slogate/-/blob/main/deploy/README.md")
    rewritten = [r for g in yaml.safe_load(out)["groups"] for r in g["rules"] if "alert" in r]
    assert [r["annotations"]["runbook_url"] for r in rewritten] == [
        f"https://code.internal/ml/slogate/-/blob/main/deploy/README.md#runbook-{r['alert'].lower()}"
        for r in rewritten]
    assert out.count("\n") == text.count("\n")
    assert script.set_runbook_base(out, "https://a/deploy/README.md") != out


@pytest.mark.parametrize("bad", ["git.example.com/README.md", "https://h/deploy/README.md#x"])
def test_bad_runbook_base_is_one_line(bad: str) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--runbook-base", bad], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"bad --runbook-base {bad!r}: give the URL of deploy/README.md "
                                               "without a '#' fragment, e.g. "
                                               "https://github.com/ORG/slogate/blob/main/deploy/README.md"]
