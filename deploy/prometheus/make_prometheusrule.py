"""Write deploy/kubernetes/base/prometheusrule.yaml from deploy/prometheus/rules.yml (one source of rules).

The PrometheusRule's `spec` is the rules file's `groups:` section, indented, comments kept.
Run after editing rules.yml: `python deploy/prometheus/make_prometheusrule.py` (tests/deploy checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
TARGET = HERE.parent / "kubernetes" / "base" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/rules.yml by deploy/prometheus/make_prometheusrule.py: edit the
# rules file and re-run the script. Prometheus Operator loads these rules into every Prometheus whose
# ruleSelector matches the labels below (kube-prometheus-stack: release: <helm release name>).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: slogate-rules
  labels:
    app.kubernetes.io/name: slogate
    release: prometheus
spec:
"""


def render(rules_text: str) -> str:
    lines = rules_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise SystemExit(f"{RULES}: no top-level `groups:` key")
    body = "\n".join(("  " + line) if line.strip() else "" for line in lines[start:])
    return HEADER + body + "\n"


def main() -> int:
    TARGET.write_text(render(RULES.read_text()))
    print(f"wrote {TARGET.relative_to(HERE.parent.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
