"""Dashboard panels broken down by upstream keep the gateways (pods) apart.

In the sidecar layout every pod's gateway has the same single upstream, `127.0.0.1:8000` (its own
vLLM), so a panel that aggregates `by (upstream)` alone adds up all pods into one line: the
"in-flight per upstream" panels show the whole fleet's load as one upstream, and one pod's dead vLLM
turns the one health line to 0 without saying which pod. Live: two gateways in front of the same
simulator (one upstream address for both, as two pods see it), a real Prometheus scraping both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.deploy.deployfiles import dashboard_panels, promql_from_grafana
from tests.realservers import prometheus_binary, promql, start_gateway, wait_scraped
from tests.servers import Server, free_port, running
from tests.simserver import start_sim

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(90)]

JOB = "slogate"
_BY_UPSTREAM = re.compile(r"\bby\s*\(([^)]*\bupstream\b[^)]*)\)")


def _per_upstream_targets() -> list[tuple[str, str, str]]:
    """(panel/refId, PromQL, legendFormat) of every dashboard query aggregated by `upstream`."""
    out = []
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            if _BY_UPSTREAM.search(target["expr"]):
                out.append((f"{panel['title']}/{target['refId']}", promql_from_grafana(target["expr"]),
                            target.get("legendFormat", "")))
    return out


TARGETS = _per_upstream_targets()


@contextlib.contextmanager
def _prometheus(targets: list[str]) -> Iterator[Server]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
    }
    with tempfile.TemporaryDirectory(prefix="slogate-prom-dash-") as tmp:
        path = Path(tmp) / "prometheus.yml"
        path.write_text(json.dumps(config))
        cmd = [prometheus_binary(), f"--config.file={path}", f"--storage.tsdb.path={Path(tmp) / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        with running(cmd, port, ready_path="/-/ready", timeout=60) as server:
            yield server


async def _traffic(urls: list[str], model: str, rounds: int = 3) -> None:
    async with aiohttp.ClientSession() as session:
        for r in range(rounds):
            if r:
                await asyncio.sleep(1.2)  # over several scrapes: rate() needs two samples
            for url in urls:
                body = {"model": model, "prompt": f"hi {r}", "max_tokens": 4, "stream": True}
                async with session.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()


def test_the_dashboard_has_per_upstream_panels() -> None:
    assert len(TARGETS) >= 4, TARGETS  # in-flight tokens/requests, routing decisions, health, ejections


@pytest.fixture(scope="module")
def prom_two_gateways() -> Iterator[str]:
    with start_sim(timing="constant", ttft_ms=5, itl_ms=2) as sim:
        model = json.load(urllib.request.urlopen(sim.url + "/v1/models", timeout=5))["data"][0]["id"]
        admins = [free_port(), free_port()]
        with (
            start_gateway(sim.url, extra_args=["--admin-listen", f"127.0.0.1:{admins[0]}"]) as gw1,
            start_gateway(sim.url, extra_args=["--admin-listen", f"127.0.0.1:{admins[1]}"]) as gw2,
            _prometheus([f"127.0.0.1:{a}" for a in admins]) as prom,
        ):
            wait_scraped(prom.url, JOB, scrapes=1)
            asyncio.run(_traffic([gw1.url, gw2.url], model))
            last = time.time()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if promql(prom.url, f'min(timestamp(up{{job="{JOB}"}})) > {last + 1:.3f}'):
                    break
                time.sleep(0.2)
            yield prom.url


@pytest.mark.parametrize("name,expr,legend", TARGETS, ids=[t[0] for t in TARGETS])
def test_per_upstream_query_keeps_gateways_apart(prom_two_gateways: str, name: str, expr: str, legend: str) -> None:
    result = promql(prom_two_gateways, expr)
    assert result, f"{name}: no data"
    # Each line of the panel: the same labels but for `instance` must come once per gateway.
    gateways: dict[tuple, set] = {}
    for r in result:
        rest = tuple(sorted((k, v) for k, v in r["metric"].items() if k != "instance"))
        gateways.setdefault(rest, set()).add(r["metric"].get("instance"))
    merged = {rest: inst for rest, inst in gateways.items() if len(inst) != 2 or None in inst}
    assert not merged, f"{name}: two gateways on one upstream gave one line for {sorted(merged)}"
    assert "{{instance}}" in legend, f"{name}: the legend {legend!r} does not say which gateway"
