"""SlogateNoHealthyUpstream can fire in the shipped sidecar layout, and does not page while a pod starts.

- Live: `slogate gateway` runs the ConfigMap's slogate.toml (addresses mapped to free ports) in front
  of a vLLM that is not up, and a real Prometheus loading deploy/prometheus/rules.yml scrapes it.
  The gateway has one upstream, which gets no health checks unless the config asks for them: the
  metric the alert reads must drop to 0, and the alert must stay inactive in the gateway's first
  minutes (the model is still loading).
- promtool (Prometheus' rule engine on synthetic series): the alert fires after its `for:` once a
  gateway older than the startup grace loses its upstream, and a young one only after the grace.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.deploy.deployfiles import KUBE, RULES, load_docs
from tests.deploy.test_live_prometheus import start_prometheus_with_rules
from tests.realservers import promql, start_gateway
from tests.servers import free_port

ALERT = "SlogateNoHealthyUpstream"
VLLM = "http://127.0.0.1:8000"  # the ConfigMap's upstream (vLLM in the same pod)


def _configmap_toml() -> str:
    cm = next(d for d in load_docs(KUBE / "base" / "configmap.yaml") if d["kind"] == "ConfigMap")
    return cm["data"]["slogate.toml"]


def _wait(prom_url: str, expr: str, timeout: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = promql(prom_url, expr)
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"no result for {expr} after {timeout}s")


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_configmap_gateway_reports_a_dead_vllm_without_paging_at_startup(tmp_path: Path) -> None:
    text = _configmap_toml()
    assert text.count(VLLM) == 1, "the ConfigMap no longer points at vLLM on 127.0.0.1:8000"
    dead = free_port()  # nothing listens: vLLM still loading its model, or crashed
    config = tmp_path / "slogate.toml"
    config.write_text(text.replace(VLLM, f"http://127.0.0.1:{dead}"))
    admin = free_port()
    with (
        start_gateway([], trace_dir=tmp_path / "traces",
                      extra_args=["--config", str(config), "--admin-listen", f"127.0.0.1:{admin}"]),
        start_prometheus_with_rules(f"127.0.0.1:{admin}", RULES) as prom,
    ):
        # What the alert reads: no upstream of the pool is healthy.
        down = _wait(prom.url, "max by (instance, pool) (slogate_upstream_healthy) < 1")
        assert [r["metric"]["pool"] for r in down] == ["default"]
        # An evaluation of the alert after that scrape: loaded, healthy, and inactive (startup grace).
        seen = time.time()
        rule: dict = {}
        deadline = time.monotonic() + 15
        while not (rule and _after(rule["lastEvaluation"], seen + 1)):
            assert time.monotonic() < deadline, f"{ALERT} not evaluated after {seen}: {rule}"
            time.sleep(0.2)
            groups = json.load(urllib.request.urlopen(prom.url + "/api/v1/rules", timeout=5))["data"]["groups"]
            rule = next(r for g in groups for r in g["rules"] if r["name"] == ALERT)
        assert rule["health"] == "ok", rule.get("lastError")
        assert rule["alerts"] == [], f"{ALERT} is active during the gateway's first minutes: {rule['alerts']}"


def _after(rfc3339: str, epoch: float) -> bool:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() > epoch


def _annotations(labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations as Prometheus renders them for `labels` (promtool compares them too)."""
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    out = {}
    for key, template in rule["annotations"].items():
        for name, value in labels.items():
            template = template.replace("{{ $labels." + name + " }}", value)
        assert "{{" not in template, template
        out[key] = template
    return out


def _unit_test(series: list[dict], alerts: list[dict]) -> dict:
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}],
    }


@pytest.mark.prometheus
def test_alert_fires_after_for_and_after_the_startup_grace(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make apt` (Debian package prometheus)"
    target = 'job="slogate", namespace="llm", instance="10.0.0.{i}:9090"'
    healthy = 'slogate_upstream_healthy{%s, upstream="127.0.0.1:8000", pool="default"}'
    started = "process_start_time_seconds{%s}"
    old, young = target.format(i=1), target.format(i=2)
    series = [
        # An old gateway (started 1000 s before the test's t=0) whose vLLM dies at t=5m.
        {"series": healthy % old, "values": "1x4 0x30"},
        {"series": started % old, "values": "-1000x34"},
        # A pod started at t=0 whose model never loads: unhealthy from the first check on.
        {"series": healthy % young, "values": "0x34"},
        {"series": started % young, "values": "0x34"},
    ]

    def firing(*targets: str) -> list[dict]:
        out = []
        for t in targets:
            labels = {"job": "slogate", "namespace": "llm", "instance": t.split('instance="')[1].rstrip('"'),
                      "pool": "default", "severity": "critical"}
            out.append({"exp_labels": labels, "exp_annotations": _annotations(labels)})
        return out

    alerts = [
        {"eval_time": "4m", "alertname": ALERT, "exp_alerts": []},  # the old one still healthy
        {"eval_time": "5m", "alertname": ALERT, "exp_alerts": []},  # pending: `for: 1m`
        {"eval_time": "6m", "alertname": ALERT, "exp_alerts": firing(old)},
        {"eval_time": "15m", "alertname": ALERT, "exp_alerts": firing(old)},  # the young one: model loading
        {"eval_time": "16m", "alertname": ALERT, "exp_alerts": firing(old, young)},  # 15 m grace + `for: 1m`
    ]
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(_unit_test(series, alerts)))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
