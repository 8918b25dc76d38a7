"""What the rendered overlays promise: disruption budget, network policy, container hardening,
replicas spread over nodes, and autoscalers that read metrics the gateway really exports.

Everything is checked on `kubectl kustomize` output (tests/deploy/deployfiles.py), so patches and
overlays are what is tested, not the files one by one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.deployfiles import (
    ADAPTER_RULES,
    KUBE,
    METRIC_SOURCES,
    find,
    kustomize_build,
    kustomize_dirs,
)

APPS = [d for d in kustomize_dirs() if d.name != "replay-job" and "epp" not in d.parts]  # those deploying llm-server
MULTI = KUBE / "overlays" / "multi-replica"
KEDA = KUBE / "overlays" / "autoscaling" / "keda"
HPA = KUBE / "overlays" / "autoscaling" / "hpa"
K8S_VERSION = kubernetes_validate.latest_version()
PROMQL_METRIC = re.compile(r"\b(slogate_[a-z0-9_]+?)(?:_bucket|_sum|_count)?\b")


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "Deployment", "llm-server")["spec"]["template"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return selector["matchLabels"].items() <= labels.items()


def _container_ports(pod: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("directory", APPS, ids=lambda p: str(p.relative_to(KUBE)))
def test_disruption_budget_covers_the_pods(directory: Path) -> None:
    docs = kustomize_build(directory)
    pdb = find(docs, "PodDisruptionBudget", "llm-server")["spec"]
    assert _selects(pdb["selector"], _pod(docs)["metadata"]["labels"])
    # maxUnavailable 1: a drain evicts one pod at a time and a single replica stays drainable.
    assert pdb == {**pdb, "maxUnavailable": 1} and "minAvailable" not in pdb


@pytest.mark.parametrize("directory", APPS, ids=lambda p: str(p.relative_to(KUBE)))
def test_network_policy_admin_port_only_from_monitoring(directory: Path) -> None:
    docs = kustomize_build(directory)
    pod = _pod(docs)
    policy = find(docs, "NetworkPolicy", "llm-server")["spec"]
    assert _selects(policy["podSelector"], pod["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    ports = _container_ports(pod)
    allowed: dict[int, list[Any]] = {}
    for rule in policy["ingress"]:
        for port in rule["ports"]:
            number = ports[port["port"]] if isinstance(port["port"], str) else port["port"]
            allowed.setdefault(number, []).append(rule.get("from"))
    assert set(allowed) == {8080, 9090}, allowed
    assert allowed[8080] == [None], "the proxy port is open to every client"
    assert allowed[9090] == [[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]]
    # The Service's and ServiceMonitor's admin port is the one the policy restricts.
    svc = find(docs, "Service", "llm-server")["spec"]["ports"]
    assert {p["targetPort"]: p["port"] for p in svc}["admin"] == 9090 == ports["admin"]
    assert find(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "admin"


def test_container_hardening() -> None:
    """Both containers: no capabilities, no privilege escalation, RuntimeDefault seccomp, read-only
    root filesystem; the gateway non-root; vLLM root (its image needs it) with every path it writes
    to on a volume."""
    pod = _pod(kustomize_build(KUBE / "base"))
    spec = pod["spec"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert sc["readOnlyRootFilesystem"] is True and sc.get("privileged") is False, c["name"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
        assert "add" not in sc["capabilities"]
        for mount in c["volumeMounts"]:
            assert mount["name"] in volumes, f"{c['name']}: {mount['name']} is no volume"
    containers = {c["name"]: c for c in spec["containers"]}
    gw, vllm = containers["slogate"], containers["vllm"]
    assert gw["securityContext"]["runAsNonRoot"] is True and gw["securityContext"]["runAsUser"] == 10001
    assert "runAsNonRoot" not in vllm["securityContext"] and "runAsUser" not in vllm["securityContext"]
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    # Every cache/scratch location the env points at lies on a writable emptyDir mount.
    writable = [path for path, name in mounts.items() if "emptyDir" in volumes[name]]
    for key in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TRITON_CACHE_DIR"):
        assert any(env[key] == w or env[key].startswith(w + "/") for w in writable), f"{key}={env[key]}"
    assert {"/tmp", "/dev/shm", "/root/.cache", "/root/.cache/huggingface"} <= set(writable)
    assert env["VLLM_NO_USAGE_STATS"] == "1"


def test_multi_replica_spread_over_nodes() -> None:
    docs = kustomize_build(MULTI)
    deploy = find(docs, "Deployment", "llm-server")["spec"]
    pod = deploy["template"]
    labels = pod["metadata"]["labels"]
    assert deploy["replicas"] == 3
    anti = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in anti] == ["kubernetes.io/hostname"]
    assert _selects(anti[0]["labelSelector"], labels)
    spread = pod["spec"]["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} == {"topology.kubernetes.io/zone"}
    assert all(_selects(s["labelSelector"], labels) and s["maxSkew"] == 1 for s in spread)
    # Rollouts and drains take at most one of three replicas down: two keep serving.
    rolling = deploy["strategy"]["rollingUpdate"]
    pdb = find(docs, "PodDisruptionBudget")["spec"]
    assert rolling["maxUnavailable"] == pdb["maxUnavailable"] == 1
    assert deploy["replicas"] - pdb["maxUnavailable"] >= 2
    # Everything else is the base's: the overlay patches only the Deployment.
    base = {(d["kind"], d["metadata"]["name"]) for d in kustomize_build(KUBE / "base")}
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == base


def _exported_metrics() -> set[str]:
    names = set()
    for path in METRIC_SOURCES:
        names |= set(re.findall(r'"(slogate_[a-z0-9_]+)"', path.read_text()))
    return names


def _queries_parse(queries: dict[str, str]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make apt` (Debian package prometheus)"
    rules = [{"record": f"autoscaling:{re.sub(r'[^a-z0-9_]', '_', name)}:query", "expr": expr}
             for name, expr in queries.items()]
    text = yaml.safe_dump({"groups": [{"name": "autoscaling", "rules": rules}]})
    out = subprocess.run([promtool, "check", "rules", "/dev/stdin"], input=text, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def _check_metrics(queries: dict[str, str]) -> None:
    exported = _exported_metrics()
    for name, expr in queries.items():
        used = set(PROMQL_METRIC.findall(re.sub(r"\{[^}]*\}", "", expr)))
        assert used, f"{name}: reads no slogate metric: {expr}"
        assert used <= exported, f"{name}: {used - exported} not exported by {[p.name for p in METRIC_SOURCES]}"


def test_keda_scaled_object() -> None:
    docs = kustomize_build(KEDA)
    deploy = find(docs, "Deployment", "llm-server")
    assert "replicas" not in deploy["spec"], "the autoscaler owns spec.replicas"
    scaled = find(docs, "ScaledObject", "llm-server")["spec"]
    target = scaled["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "llm-server")
    assert 2 <= scaled["minReplicaCount"] <= scaled["fallback"]["replicas"] <= scaled["maxReplicaCount"]
    triggers = {t["name"]: t for t in scaled["triggers"]}
    assert {t["type"] for t in triggers.values()} == {"prometheus"}
    queries = {name: t["metadata"]["query"] for name, t in triggers.items()}
    _check_metrics(queries)
    _queries_parse(queries)
    for t in triggers.values():
        float(t["metadata"]["threshold"])
        assert 'job="slogate"' in t["metadata"]["query"], "the rules' job label selects the gateway"
    assert "slogate_inflight_requests" in queries["inflight"] and triggers["inflight"]["metricType"] == "AverageValue"
    assert "slogate_queue_seconds_bucket" in queries["queue"] and "or vector(0)" in queries["queue"]
    # The HPA behavior KEDA passes through is a valid autoscaling/v2 behavior.
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": target, "maxReplicas": 2, "behavior": behavior}}
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)


def _adapter_rules() -> dict[str, list[dict[str, Any]]]:
    return yaml.safe_load(ADAPTER_RULES.read_text())["rules"]


def _adapter_query(rule: dict[str, Any], matchers: str, group_by: str) -> str:
    series = rule["seriesQuery"].split("{", 1)[0].strip("'")
    return (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", group_by))


def test_hpa_reads_metrics_the_adapter_serves() -> None:
    docs = kustomize_build(HPA)
    assert "replicas" not in find(docs, "Deployment", "llm-server")["spec"]
    hpa = find(docs, "HorizontalPodAutoscaler", "llm-server")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-server"}
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    rules = _adapter_rules()
    served = {"Pods": {r["name"]["as"]: r for r in rules["custom"]},
              "External": {r["name"]["as"]: r for r in rules["external"]}}
    queries = {}
    for metric in hpa["metrics"]:
        kind = metric["type"]
        name = metric[kind.lower()]["metric"]["name"]
        assert name in served[kind], f"HPA {kind} metric {name}: no prometheus-adapter rule serves it"
        rule = served[kind][name]
        series = rule["seriesQuery"].split("{", 1)[0].strip("'")
        assert re.fullmatch(rule["name"]["matches"], series), rule
        group_by = "namespace,pod" if kind == "Pods" else "namespace"
        queries[name] = _adapter_query(rule, 'namespace="llm",job="slogate"', group_by)
    assert set(queries) == {"slogate_inflight_requests", "slogate_queue_seconds_p90"}
    _check_metrics(queries)
    _queries_parse(queries)


def test_autoscalers_agree() -> None:
    """The KEDA and HPA variants are one policy: same bounds, thresholds and behavior."""
    scaled = find(kustomize_build(KEDA), "ScaledObject")["spec"]
    hpa = find(kustomize_build(HPA), "HorizontalPodAutoscaler")["spec"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    assert scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    thresholds = {t["name"]: float(t["metadata"]["threshold"]) for t in scaled["triggers"]}
    targets = {m[m["type"].lower()]["metric"]["name"]: m[m["type"].lower()]["target"] for m in hpa["metrics"]}
    assert float(targets["slogate_inflight_requests"]["averageValue"]) == thresholds["inflight"]
    value = targets["slogate_queue_seconds_p90"]["value"]
    assert (float(value[:-1]) / 1000 if value.endswith("m") else float(value)) == thresholds["queue"]
