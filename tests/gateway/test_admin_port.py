"""Admin endpoints off the public port unless asked: by default /metrics and /slogate/status answer only
on 127.0.0.1 at the proxy port + 1 (on the proxy port /metrics is the upstream's, relayed), the probes
answer on both; `--admin-listen proxy` is the opt-in to serve them on the proxy port.
"""

from __future__ import annotations

import sys

import orjson
import pytest

from slogate.gateway.config import GatewayConfig, admin_address, build_config
from slogate.traces.usage import UsageError
from tests.gateway.fixtures_gateway import get, http_request, start_gateway
from tests.servers import free_ports, running
from tests.simserver import start_sim


def test_by_default_admin_endpoints_are_on_loopback_at_the_proxy_port_plus_one():
    port = free_ports(2)  # the proxy port and the one after it are free
    cmd = [sys.executable, "-m", "slogate", "gateway", "--listen", f"127.0.0.1:{port}"]
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, \
            running([*cmd, "--upstream", sim.url], port, ready_path="/healthz",
                    env={"SLOGATE_TRACE_SALT": "t"}) as gw:
        admin = f"http://127.0.0.1:{port + 1}"
        assert b"slogate_requests_total" in get(admin + "/metrics")
        assert "windows" in orjson.loads(get(admin + "/slogate/status"))
        proxied = get(gw.url + "/metrics")  # the proxy port relays /metrics to the upstream
        assert b"vllm:num_requests_running" in proxied and b"slogate_requests_total" not in proxied
        status, _, _ = http_request(gw.url, "GET", "/slogate/status")
        assert status == 404  # relayed too: the simulator has no such path
        for url in (gw.url, admin):  # Kubernetes probes work on either port
            assert http_request(url, "GET", "/healthz")[0] == 200
            assert http_request(url, "GET", "/readyz")[0] == 200
        assert f"admin on 127.0.0.1:{port + 1}" in gw.log_text()


def test_admin_listen_proxy_serves_them_on_the_proxy_port():
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, \
            start_gateway(sim.url, "--admin-listen", "proxy") as gw:
        assert gw.admin_url == gw.url  # type: ignore[attr-defined]
        text = get(gw.url + "/metrics")
        assert b"slogate_requests_total" in text and b"vllm:" not in text
        assert "windows" in orjson.loads(get(gw.url + "/slogate/status"))
        assert "(--admin-listen proxy)" in gw.log_text()


def test_admin_address_values_and_errors():
    def cfg(**kw: object) -> GatewayConfig:
        return build_config({"upstreams": ["http://127.0.0.1:8000"], **kw})

    assert cfg().admin_listen == "auto"
    assert admin_address(cfg(listen="0.0.0.0:8080")) == ("127.0.0.1", 8081)  # never public by default
    assert admin_address(cfg(admin_listen="0.0.0.0:9090")) == ("0.0.0.0", 9090)
    assert admin_address(cfg(admin_listen="proxy")) is None
    with pytest.raises(UsageError, match="admin_listen"):
        cfg(listen="0.0.0.0:65535")  # no port after it
    with pytest.raises(UsageError, match='got "9090"'):
        cfg(admin_listen="9090")
    with pytest.raises(UsageError, match="not proxy"):
        cfg(workers=2, admin_listen="proxy")
    assert admin_address(cfg(workers=2)) == ("127.0.0.1", 8081)  # the supervisor serves the merged endpoints

