"""JSON Schemas for the custom-resource kinds under deploy/ (Prometheus Operator, KEDA, Gateway API).

kubernetes-validate ships schemas for built-in kinds only and skips the rest, so these are written
here: the fields these manifests use and their siblings, unknown keys rejected, types as the CRDs
declare them. A subset, not a copy of the CRDs: a real field missing here fails loudly (add it).
"""

from __future__ import annotations

from typing import Any

import jsonschema

STR = {"type": "string", "minLength": 1}
INT = {"type": "integer", "minimum": 0}
DNS_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


LABEL_SELECTOR = _obj({
    "matchLabels": {**STR_MAP, "minProperties": 1},
    "matchExpressions": {"type": "array", "items": _obj(
        {"key": STR, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
         "values": {"type": "array", "items": {"type": "string"}}}, ("key", "operator"))},
})
METADATA = {
    "type": "object",
    "properties": {"name": DNS_NAME, "namespace": DNS_NAME, "labels": STR_MAP, "annotations": STR_MAP},
    "required": ["name"],
    "additionalProperties": False,
}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _obj({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
                ("apiVersion", "kind", "metadata", "spec"))


RELABEL = _obj({
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                        "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "uppercase",
                        "keepequal", "dropequal"]},
    "sourceLabels": {"type": "array", "items": STR}, "separator": {"type": "string"}, "targetLabel": STR,
    "regex": {"type": "string"}, "modulus": INT, "replacement": {"type": "string"},
})
SERVICE_MONITOR = _resource("monitoring.coreos.com/v1", "ServiceMonitor", _obj({
    "selector": LABEL_SELECTOR,
    "namespaceSelector": _obj({"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STR}}),
    "endpoints": {"type": "array", "minItems": 1, "items": _obj({
        "port": STR, "targetPort": {"type": ["string", "integer"]}, "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https"]}, "interval": DURATION, "scrapeTimeout": DURATION,
        "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
        "relabelings": {"type": "array", "items": RELABEL}, "metricRelabelings": {"type": "array", "items": RELABEL},
        "params": {"type": "object"},
    })},
    "jobLabel": STR, "targetLabels": {"type": "array", "items": STR}, "podTargetLabels": {"type": "array", "items": STR},
    "sampleLimit": INT, "scrapeProtocols": {"type": "array", "items": STR},
}, ("selector", "endpoints")))

RULE = {
    "oneOf": [
        _obj({"record": STR, "expr": STR, "labels": STR_MAP}, ("record", "expr")),
        _obj({"alert": STR, "expr": STR, "for": DURATION, "keep_firing_for": DURATION, "labels": STR_MAP,
              "annotations": STR_MAP}, ("alert", "expr")),
    ]
}
PROMETHEUS_RULE = _resource("monitoring.coreos.com/v1", "PrometheusRule", _obj({
    "groups": {"type": "array", "minItems": 1, "items": _obj({
        "name": STR, "interval": DURATION, "limit": INT, "partial_response_strategy": {"type": "string"},
        "labels": STR_MAP, "query_offset": DURATION,
        "rules": {"type": "array", "minItems": 1, "items": RULE},
    }, ("name", "rules"))},
}, ("groups",)))

# KEDA: trigger metadata is map[string]string (a bare number there is rejected by the API server).
PROMETHEUS_TRIGGER_METADATA = {
    "type": "object",
    "properties": {k: {"type": "string"} for k in (
        "serverAddress", "query", "threshold", "activationThreshold", "namespace", "customHeaders",
        "ignoreNullValues", "unsafeSsl", "queryParameters", "authModes", "timeout")},
    "required": ["serverAddress", "query", "threshold"],
    "additionalProperties": False,
}
TRIGGER = {
    "allOf": [
        _obj({"type": STR, "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
              "metadata": STR_MAP, "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
              "authenticationRef": _obj({"name": STR, "kind": {"enum": ["TriggerAuthentication",
                                                                      "ClusterTriggerAuthentication"]}}, ("name",)),
              "useCachedMetrics": {"type": "boolean"}}, ("type", "metadata")),
        {"if": {"properties": {"type": {"const": "prometheus"}}},
         "then": {"properties": {"metadata": PROMETHEUS_TRIGGER_METADATA}}},
    ]
}
SCALED_OBJECT = _resource("keda.sh/v1alpha1", "ScaledObject", _obj({
    "scaleTargetRef": _obj({"apiVersion": STR, "kind": STR, "name": STR, "envSourceContainerName": STR}, ("name",)),
    "pollingInterval": INT, "cooldownPeriod": INT, "initialCooldownPeriod": INT, "idleReplicaCount": INT,
    "minReplicaCount": INT, "maxReplicaCount": {"type": "integer", "minimum": 1},
    "fallback": _obj({"failureThreshold": {"type": "integer", "minimum": 1}, "replicas": INT,
                      "behavior": {"enum": ["static", "currentReplicas", "currentReplicasIfHigher",
                                            "currentReplicasIfLower"]}}, ("failureThreshold", "replicas")),
    "advanced": _obj({
        "restoreToOriginalReplicaCount": {"type": "boolean"},
        # behavior is an autoscaling/v2 HPA behavior: tests validate it with kubernetes-validate.
        "horizontalPodAutoscalerConfig": _obj({"name": STR, "behavior": {"type": "object"}}),
        "scalingModifiers": _obj({"formula": STR, "target": STR, "activationTarget": STR,
                                  "metricType": {"enum": ["AverageValue", "Value"]}}),
    }),
    "triggers": {"type": "array", "minItems": 1, "items": TRIGGER},
}, ("scaleTargetRef", "triggers")))

PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
# Gateway API Inference Extension v1 and Gateway API v1 (deploy/kubernetes/epp/gateway-api)
INFERENCE_POOL = _resource("inference.networking.k8s.io/v1", "InferencePool", _obj({
    "selector": _obj({"matchLabels": {**STR_MAP, "minProperties": 1}}, ("matchLabels",)),
    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _obj({"number": PORT_NUMBER}, ("number",))},
    "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
    "endpointPickerRef": _obj({"group": {"type": "string"}, "kind": STR, "name": STR,
                               "port": _obj({"number": PORT_NUMBER}, ("number",)),
                               "failureMode": {"enum": ["FailOpen", "FailClose"]}}, ("name",)),
}, ("selector", "targetPorts", "endpointPickerRef")))
_BACKEND_REF = _obj({"group": {"type": "string"}, "kind": STR, "name": STR, "namespace": DNS_NAME, "port": PORT_NUMBER,
                     "weight": INT}, ("name",))
HTTP_ROUTE = _resource("gateway.networking.k8s.io/v1", "HTTPRoute", _obj({
    "parentRefs": {"type": "array", "items": _obj({"group": {"type": "string"}, "kind": STR, "name": STR,
                                                   "namespace": DNS_NAME, "sectionName": STR, "port": PORT_NUMBER},
                                                  ("name",))},
    "hostnames": {"type": "array", "items": STR},
    "rules": {"type": "array", "items": _obj({
        "name": STR,
        "matches": {"type": "array", "items": _obj({
            "path": _obj({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]}, "value": STR}),
            "method": STR, "headers": {"type": "array"}, "queryParams": {"type": "array"}})},
        "backendRefs": {"type": "array", "items": _BACKEND_REF},
        "timeouts": _obj({"request": DURATION, "backendRequest": DURATION}),
        "filters": {"type": "array"},
    })},
}))

SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE, "ScaledObject": SCALED_OBJECT,
           "InferencePool": INFERENCE_POOL, "HTTPRoute": HTTP_ROUTE}


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when `doc` does not match the schema of its kind."""
    schema = SCHEMAS[doc["kind"]]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)
