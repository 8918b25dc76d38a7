"""The Kubernetes manifests and kustomizations under deploy/ are valid and consistent.

Built-in kinds validate with kubernetes-validate (strict) for its newest Kubernetes version; the CRD
kinds (ServiceMonitor, PrometheusRule, ScaledObject) against tests/deploy/crd_schemas.py. Every
kustomization is rendered with `kubectl kustomize` (kustomize v5, `make apt`) and its output
validated the same way. No cluster and no Docker daemon needed.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from slogate.gateway.config import build_config, read_toml
from tests.deploy import crd_schemas
from tests.deploy.deployfiles import (
    CRD_KINDS,
    DEPLOY,
    KUBE,
    KUSTOMIZATION,
    PROMETHEUS_RULE,
    REPO,
    RULES,
    kustomization,
    kustomize_build,
    kustomize_dirs,
    load_docs,
    manifest_files,
)

K8S_VERSION = kubernetes_validate.latest_version()


def validate_object(doc: dict, where: str) -> None:
    """kubernetes-validate for built-in kinds; the schemas of tests/deploy/crd_schemas.py for CRD
    kinds (kubernetes-validate would skip them: it has no schema for them)."""
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if doc["kind"] in CRD_KINDS:
        try:
            crd_schemas.validate(doc)
        except jsonschema.ValidationError as exc:
            path = "/".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{where}: {name} does not match its CRD schema at {path}: {exc.message}")
        return
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        pytest.fail(f"{where}: {name} invalid for Kubernetes {K8S_VERSION} at {path}: {exc.message}")


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBE)))
def test_manifest_validates(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        validate_object(doc, str(path.relative_to(REPO)))


@pytest.mark.parametrize("directory", kustomize_dirs(), ids=lambda p: str(p.relative_to(KUBE)))
def test_kustomization_references_every_file(directory: Path) -> None:
    kust = kustomization(directory)
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and kust["kind"] == "Kustomization"
    referenced = set()
    for entry in kust.get("resources", []):
        path = (directory / entry).resolve()
        assert path.exists(), f"{directory / KUSTOMIZATION}: resource {entry} does not exist"
        referenced.add(path)
    for patch in kust.get("patches", []):
        if "patch" in patch:  # inline
            continue
        path = (directory / patch["path"]).resolve()
        assert path.is_file(), f"{directory / KUSTOMIZATION}: patch {patch['path']} does not exist"
        referenced.add(path)
    orphans = [p.name for p in directory.glob("*.yaml") if p.name != KUSTOMIZATION and p.resolve() not in referenced]
    assert not orphans, f"{directory}: files not listed in {KUSTOMIZATION}: {orphans}"


@pytest.mark.parametrize("directory", kustomize_dirs(), ids=lambda p: str(p.relative_to(KUBE)))
def test_kustomize_build_validates(directory: Path) -> None:
    """The rendered output (patches applied, generators run) validates too, every object carries the
    common label, and names are unique per kind."""
    docs = kustomize_build(directory)
    assert docs
    seen = set()
    for doc in docs:
        validate_object(doc, f"kubectl kustomize {directory.relative_to(REPO)}")
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "slogate"
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in seen, f"{directory}: {key} rendered twice"
        seen.add(key)


def test_validation_rejects_broken_objects() -> None:
    """The validators can fail: a typo in a built-in field and a number in KEDA's string metadata."""
    deploy = next(d for d in kustomize_build(KUBE / "base") if d["kind"] == "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(pytest.fail.Exception, match="readOnlyRootFilesytem"):
        validate_object(deploy, "mutated")
    scaled = next(d for d in kustomize_build(KUBE / "overlays" / "autoscaling" / "keda") if d["kind"] == "ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 32
    with pytest.raises(pytest.fail.Exception, match="threshold"):
        validate_object(scaled, "mutated")
    rule = load_docs(PROMETHEUS_RULE)[0]
    rule["spec"]["groups"][0]["rules"][0]["alert"] = "BothRecordAndAlert"
    with pytest.raises(pytest.fail.Exception, match="CRD schema"):
        validate_object(rule, "mutated")


def _base(kind: str, name: str | None = None) -> dict:
    for path in manifest_files():
        for doc in load_docs(path):
            if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
                return doc
    raise AssertionError(f"no {kind} {name or ''} under {KUBE}")


def test_configmap_is_a_valid_gateway_config(tmp_path: Path) -> None:
    """The TOML in the ConfigMap passes the gateway's own validation (keys and values)."""
    text = _base("ConfigMap", "slogate-config")["data"]["slogate.toml"]
    tomllib.loads(text)
    (tmp_path / "slogate.toml").write_text(text)
    cfg = build_config(read_toml(tmp_path / "slogate.toml"))
    assert cfg.listen.endswith(":8080") and cfg.admin_listen is not None and cfg.admin_listen.endswith(":9090")
    assert cfg.upstreams == ["http://127.0.0.1:8000"]
    assert cfg.trace.dir == "/var/lib/slogate/traces"
    assert "interactive" in cfg.slos


def test_sidecar_pod_wiring() -> None:
    deploy = _base("Deployment", "llm-server")
    pod = deploy["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    gw, vllm = containers["slogate"], containers["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert "--host=127.0.0.1" in vllm["args"] and "--port=8000" in vllm["args"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {p["containerPort"] for p in gw["ports"]} == {8080, 9090}
    assert gw["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gw["livenessProbe"]["httpGet"]["path"] == "/healthz"
    salt = next(e for e in gw["env"] if e["name"] == "SLOGATE_TRACE_SALT")
    assert salt["valueFrom"]["secretKeyRef"]["name"] == _base("Secret")["metadata"]["name"]
    assert gw["securityContext"]["runAsNonRoot"] is True
    mounts = {m["name"]: m["mountPath"] for m in gw["volumeMounts"]}
    assert mounts["traces"] == "/var/lib/slogate/traces" and mounts["slogate-config"] == "/etc/slogate"
    assert {v["name"] for v in pod["volumes"]} >= set(mounts) | {m["name"] for m in vllm["volumeMounts"]}
    # Streams drain: the grace period covers the preStop sleep plus the gateway's shutdown_grace.
    cfg = tomllib.loads(_base("ConfigMap", "slogate-config")["data"]["slogate.toml"])["gateway"]
    pre_stop = int(gw["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + cfg["shutdown_grace"] + 10
    # The Service's target ports exist on the gateway container; scrape annotations point at admin.
    svc = _base("Service")
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {p["name"] for p in gw["ports"]}
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    monitor = _base("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_prometheusrule_embeds_rules_file() -> None:
    """The PrometheusRule's groups are exactly deploy/prometheus/rules.yml (make_prometheusrule.py)."""
    stale = "deploy/kubernetes/base/prometheusrule.yaml is stale: run python deploy/prometheus/make_prometheusrule.py"
    rule = load_docs(PROMETHEUS_RULE)[0]
    assert rule["spec"] == yaml.safe_load(RULES.read_text()), stale
    spec = importlib.util.spec_from_file_location("make_prometheusrule", DEPLOY / "prometheus" / "make_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert PROMETHEUS_RULE.read_text() == generator.render(RULES.read_text()), stale


def test_replay_job_shards_agree() -> None:
    """Indexed Job: N = completions = parallelism = the N of --shard i/N = the merge Job's SHARDS."""
    job = _base("Job", "slogate-replay")["spec"]
    assert job["completionMode"] == "Indexed"
    n = job["completions"]
    assert job["parallelism"] == n and n >= 2
    replay = job["template"]["spec"]["containers"][0]
    script = replay["args"][0]
    assert replay["command"] == ["sh", "-c"] and "slogate replay " in script
    assert '--shard "$JOB_COMPLETION_INDEX/$SHARDS"' in script and '--start-at "$START_AT"' in script
    assert script.rstrip().endswith('touch "$out/.done"')
    merge = _base("Job", "slogate-replay-merge")["spec"]["template"]["spec"]
    for container in [replay, *merge["initContainers"], *merge["containers"]]:
        shards = next(e["value"] for e in container["env"] if e["name"] == "SHARDS")
        assert int(shards) == n, container["name"]
    assert '.done" ]' in merge["initContainers"][0]["args"][0]
    assert "slogate merge" in merge["containers"][0]["args"][0]
    # Every configMapKeyRef of the generated params names a key the generator defines.
    kust = kustomization(KUBE / "replay-job")
    keys = {lit.split("=", 1)[0] for gen in kust["configMapGenerator"] for lit in gen["literals"]}
    for env in job["template"]["spec"]["containers"][0]["env"]:
        ref = env.get("valueFrom", {}).get("configMapKeyRef")
        if ref and ref["name"] == "slogate-replay-params":
            assert ref["key"] in keys

