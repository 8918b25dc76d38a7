"""The Prometheus rules pass `promtool check rules` and the Grafana dashboard is a valid JSON model.

Static checks only; tests/deploy/test_live_prometheus.py evaluates the same expressions against a
real Prometheus scraping a running gateway.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.deploy.deployfiles import (
    README,
    RULES,
    alerting_rules,
    dashboard,
    dashboard_panels,
    dashboard_queries,
    metric_names,
    recording_rules,
    rule_groups,
)

# The gateway's metric names (issue #4; routing ones arrive with the routing work).
GATEWAY_METRICS = {
    "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
    "gen_ai_server_request_duration_seconds", "gen_ai_client_token_usage",
    "slogate_inter_token_latency_seconds", "slogate_queue_seconds", "slogate_gateway_overhead_seconds",
    "slogate_requests_total", "slogate_good_requests_total", "slogate_slo_requests_total", "slogate_good_output_tokens_total",
    "slogate_output_tokens_total", "slogate_input_tokens_total", "slogate_inflight_requests",
    "slogate_inflight_tokens", "slogate_trace_records_total", "slogate_event_loop_lag_seconds",
    "slogate_routing_decisions_total", "slogate_upstream_healthy", "slogate_retries_total",
    "slogate_rejections_total", "slogate_ejections_total", "slogate_queue_depth",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
RECORD_NAME = re.compile(r"^slogate:[a-z0-9_]+:[a-z0-9_]+$")
PANEL_TYPES = {"row", "timeseries", "stat", "heatmap", "gauge", "table", "bargauge"}


def _family(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in GATEWAY_METRICS:
            return name[: -len(suffix)]
    return name


def test_promtool_check_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make apt` (Debian package prometheus)"
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(recording_rules()) + len(alerting_rules())} rules found" in out.stdout


def test_rule_names_and_metrics() -> None:
    """Recording rules follow level:metric:operations; every metric read is one the gateway exports."""
    names = [r["record"] for r in recording_rules()]
    assert len(names) == len(set(names))
    for name in names:
        assert RECORD_NAME.match(name), name
    required = {"slogate:goodput_rps:rate5m", "slogate:goodput_tps:rate5m", "slogate:slo_attainment:ratio_rate5m",
                "slogate:ttft_seconds:p99_rate5m", "slogate:tpot_seconds:p99_rate5m", "slogate:request_rps:rate5m"}
    assert required <= set(names)
    alerts = {r["alert"] for r in alerting_rules()}
    assert {"SlogateSLOBudgetBurnFast", "SlogateSLOBudgetBurnSlow", "SlogateTTFTAboveSLO",
            "SlogateTraceRecordsDropped", "SlogateNoHealthyUpstream", "SlogateGatewayDown",
            "SlogateEventLoopLagHigh"} <= alerts
    for rule in alerting_rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    for group in rule_groups():
        for rule in group["rules"]:
            unknown = {_family(m) for m in metric_names(rule["expr"])} - GATEWAY_METRICS
            assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {unknown}"


def test_dashboard_model() -> None:
    dash = dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] and dash["title"] and dash["id"] is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = set()
    for panel in dashboard_panels():
        assert panel["type"] in PANEL_TYPES, panel["title"]
        assert panel["id"] not in ids, f"duplicate panel id {panel['id']}"
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
            unknown = {_family(m) for m in metric_names(target["expr"])} - GATEWAY_METRICS
            assert not unknown, f"{panel['title']}: unknown metrics {unknown}"
            if panel["type"] == "heatmap":
                assert target["format"] == "heatmap" and "_bucket" in target["expr"]
    titles = " ".join(p["title"].lower() for p in dashboard_panels())
    for topic in ("goodput", "attainment", "ttft", "tpot", "in-flight tokens", "routing", "trace"):
        assert topic in titles, topic


@pytest.mark.parametrize("name,expr", dashboard_queries(), ids=[q[0] for q in dashboard_queries()])
def test_dashboard_queries_parse(name: str, expr: str) -> None:
    """Each dashboard query, variables substituted, is valid PromQL (promtool parses it as a rule)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make apt`"
    assert "$" not in expr, f"{name}: unsubstituted Grafana variable in {expr}"
    out = subprocess.run([promtool, "check", "rules", "/dev/stdin"], capture_output=True, text=True, timeout=30,
                         input=_rule_file(expr))
    assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"


def _rule_file(expr: str) -> str:
    quoted = expr.replace("\\", "\\\\").replace('"', '\\"')
    return f'groups:\n  - name: dashboard\n    rules:\n      - record: dashboard:query:check\n        expr: "{quoted}"\n'


def _github_anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading: lower case, punctuation
    other than '-' and '_' removed, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _readme_sections() -> dict[str, str]:
    """anchor → the section's text up to the next heading of any level."""
    sections: dict[str, str] = {}
    anchor = None
    fenced = False
    for line in README.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6} (.+)$", line)
        if m:
            anchor = _github_anchor(m[1])
            sections[anchor] = ""
        elif anchor is not None:
            sections[anchor] += line + "\n"
    return sections


def test_every_alert_has_a_runbook() -> None:
    """runbook_url on every alert (in rules.yml, hence the PrometheusRule) → #runbook-<alert> in
    deploy/README.md, a section with the four parts; all URLs share one base (one sed replaces it);
    no runbook for an alert that does not exist."""
    sections = _readme_sections()
    bases = set()
    alerts = {r["alert"] for r in alerting_rules()}
    for rule in alerting_rules():
        url = rule["annotations"].get("runbook_url")
        assert url, f"{rule['alert']}: no runbook_url annotation"
        base, _, anchor = url.partition("#")
        assert base.startswith("https://") and base.endswith("/deploy/README.md"), url
        assert anchor == f"runbook-{rule['alert'].lower()}", url
        assert anchor in sections, f"{rule['alert']}: deploy/README.md has no heading with anchor #{anchor}"
        body = sections[anchor]
        for part in ("**What it means.**", "**First checks.**", "**Likely causes.**", "**What to do.**"):
            assert part in body, f"runbook {anchor}: missing {part}"
        bases.add(base)
    assert len(bases) == 1, bases
    stale = {a for a in sections if a.startswith("runbook-")} - {f"runbook-{a.lower()}" for a in alerts}
    assert not stale, f"runbooks for alerts that do not exist: {stale}"
