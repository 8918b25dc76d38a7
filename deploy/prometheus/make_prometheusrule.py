"""Write deploy/kubernetes/base/prometheusrule.yaml from deploy/prometheus/rules.yml (one source of rules).

The PrometheusRule's `spec` is the rules file's `groups:` section, indented, comments kept.
Run after editing rules.yml: `python deploy/prometheus/make_prometheusrule.py` (tests/deploy checks it).
`--runbook-base URL` first points every alert's runbook_url at URL (keeping its `#runbook-…` anchor).
Never touches any file but these two.
"""

from __future__ import annotations

import argparse
import re
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


_RUNBOOK_URL = re.compile(r"(?m)^(\s*runbook_url:\s*)(\S+?)(#runbook-[a-z0-9-]+)\s*$")


def set_runbook_base(rules_text: str, base: str) -> str:
    """`rules_text` with every runbook_url's part before `#runbook-…` replaced by `base`."""
    if not re.fullmatch(r"https?://\S+", base) or "#" in base:
        raise ValueError(f"bad --runbook-base {base!r}: give the URL of deploy/README.md without a '#' "
                         "fragment, e.g. https://github.com/ORG/slogate/blob/main/deploy/README.md")
    return _RUNBOOK_URL.sub(lambda m: f"{m[1]}{base}{m[3]}", rules_text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runbook-base", metavar="URL", help="where deploy/README.md is served (rewrites rules.yml)")
    args = p.parse_args(argv)
    if args.runbook_base:
        try:
            RULES.write_text(set_runbook_base(RULES.read_text(), args.runbook_base))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    TARGET.write_text(render(RULES.read_text()))
    print(f"wrote {TARGET.relative_to(HERE.parent.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
