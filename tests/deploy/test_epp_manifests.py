"""deploy/kubernetes/epp: the Gateway API mode (InferencePool → slogate-epp Service; endpoints from the
EndpointSlices of the pool's Service, with RBAC) and the standalone pod (Envoy + slogate epp, a static
endpoints file) are wired consistently with each other and with deploy/envoy-epp.yaml.
(Schema validation of every object is tests/deploy/test_manifests.py's, which renders these too.)
"""

from __future__ import annotations

import yaml

from slogate.gateway.epp.cli import config_of, epp_parser, kube_of
from slogate.gateway.epp.kube import SERVICE_LABEL, KubeSource
from tests.deploy.deployfiles import DEPLOY, KUBE, find, kustomize_build

GATEWAY_API = KUBE / "epp" / "gateway-api"
STANDALONE = KUBE / "epp" / "standalone"


def _args(container: dict) -> list[str]:
    args = container["args"]
    assert args[0] == "epp"
    return args[1:]


def test_inferencepool_points_at_the_epp_service_grpc_port():
    docs = kustomize_build(GATEWAY_API)
    pool = find(docs, "InferencePool", "vllm-pool")["spec"]
    service = find(docs, "Service", pool["endpointPickerRef"]["name"])
    grpc = next(p for p in service["spec"]["ports"] if p["port"] == pool["endpointPickerRef"]["port"]["number"])
    assert grpc["appProtocol"] == "kubernetes.io/h2c" and pool["endpointPickerRef"]["failureMode"] == "FailClose"
    route = find(docs, "HTTPRoute", "vllm-route")["spec"]
    assert route["rules"][0]["backendRefs"][0] == {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                   "name": "vllm-pool"}
    epp = find(docs, "Deployment", "slogate-epp")["spec"]["template"]["spec"]["containers"][0]
    listen = next(a for a in _args(epp) if a.startswith("--listen="))
    assert listen.endswith(":9002") and {"name": "grpc", "containerPort": 9002, "protocol": "TCP"} in epp["ports"]


def test_epp_args_are_a_valid_config(tmp_path):
    """The containers' flags pass `slogate epp`'s own parsing and validation: the Gateway API mode
    watches a Service's EndpointSlices (no cluster needed to validate), the standalone pod reads
    its endpoints ConfigMap."""
    pod = find(kustomize_build(GATEWAY_API), "Deployment", "slogate-epp")["spec"]["template"]["spec"]
    args = epp_parser().parse_args(_args(next(c for c in pod["containers"] if c["name"] == "epp")))
    cfg = config_of(args)
    assert cfg.upstreams == [] and kube_of(args) == KubeSource(f"{SERVICE_LABEL}=vllm", ("http",))
    assert cfg.admin_listen == "0.0.0.0:9090" and cfg.routing.scrape_upstream_metrics
    docs = kustomize_build(STANDALONE)
    pod = find(docs, "Deployment", "slogate-epp-envoy")["spec"]["template"]["spec"]
    epp = next(c for c in pod["containers"] if c["name"] == "epp")
    endpoints = tmp_path / "standalone.endpoints"
    endpoints.write_text(find(docs, "ConfigMap", "slogate-epp-endpoints")["data"]["endpoints"])
    args = [a if not a.startswith("--endpoints-file=") else f"--endpoints-file={endpoints}" for a in _args(epp)]
    cfg = config_of(epp_parser().parse_args(args))
    assert cfg.upstreams == ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]
    assert cfg.admin_listen == "0.0.0.0:9090" and cfg.routing.scrape_upstream_metrics


def test_the_epp_watches_the_pools_pods_with_just_enough_rbac():
    """--kube-service names a Service that selects the InferencePool's pods, its --endpoint-target-ports
    port is the pool's target port, and the pod's service account may get/list/watch EndpointSlices
    in its namespace and nothing else."""
    docs = kustomize_build(GATEWAY_API)
    pool = find(docs, "InferencePool", "vllm-pool")["spec"]
    pod = find(docs, "Deployment", "slogate-epp")["spec"]["template"]["spec"]
    source = kube_of(epp_parser().parse_args(_args(pod["containers"][0])))
    service = find(docs, "Service", source.label_selector.removeprefix(f"{SERVICE_LABEL}="))["spec"]
    assert service["selector"] == pool["selector"]["matchLabels"] and service["clusterIP"] == "None"
    port = next(p for p in service["ports"] if p["name"] in source.target_ports)
    assert [{"number": port["targetPort"]}] == pool["targetPorts"]
    account = find(docs, "ServiceAccount", pod["serviceAccountName"])["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    binding = next(d for d in docs if d["kind"] == "RoleBinding"
                   and {"kind": "ServiceAccount", "name": account} in d["subjects"])
    role = find(docs, "Role", binding["roleRef"]["name"])
    assert binding["roleRef"]["kind"] == "Role"
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    assert not any(d["kind"] in ("ClusterRole", "ClusterRoleBinding") for d in docs)


def test_standalone_pod_runs_deploy_envoy_epp_yaml_unchanged():
    docs = kustomize_build(STANDALONE)
    embedded = yaml.safe_load(find(docs, "ConfigMap", "slogate-epp-envoy")["data"]["envoy.yaml"])
    assert embedded == yaml.safe_load((DEPLOY / "envoy-epp.yaml").read_text())
    pod = find(docs, "Deployment", "slogate-epp-envoy")["spec"]["template"]["spec"]
    epp = next(c for c in pod["containers"] if c["name"] == "epp")
    cluster = next(c for c in embedded["static_resources"]["clusters"] if c["name"] == "slogate_epp")
    port = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert f"--listen={port['address']}:{port['port_value']}" in _args(epp)
    ext_proc = embedded["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "http_filters"][0]["typed_config"]
    assert ext_proc["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert ext_proc["failure_mode_allow"] is False


def test_the_crd_schemas_can_fail():
    import jsonschema
    import pytest

    from tests.deploy import crd_schemas

    pool = find(kustomize_build(GATEWAY_API), "InferencePool", "vllm-pool")
    pool["spec"]["endpointPickerRef"]["failureMode"] = "FailClosed"
    with pytest.raises(jsonschema.ValidationError):
        crd_schemas.validate(pool)
    route = find(kustomize_build(GATEWAY_API), "HTTPRoute", "vllm-route")
    route["spec"]["rules"][0]["backendRef"] = route["spec"]["rules"][0].pop("backendRefs")
    with pytest.raises(jsonschema.ValidationError):
        crd_schemas.validate(route)
