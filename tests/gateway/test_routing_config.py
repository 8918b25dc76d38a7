"""Routing configuration through the gateway's own path: TOML tables, flags, one-line errors."""

from __future__ import annotations

import pytest

from slogate.gateway import cli
from slogate.gateway.config import build_config, merge, read_toml, upstream_specs
from slogate.traces.usage import UsageError

TOML = """
[gateway]
listen = "127.0.0.1:8080"
upstreams = ["http://10.0.0.1:8000#name=a"]

[[upstream]]
url = "http://10.0.0.2:8000"
name = "b"
pool = "long"
weight = 2
models = ["llama-3-70b"]

[routing]
policy = "prefix-affinity"
pools = ["long: prompt_tokens >= 4096 or max_tokens >= 2048"]
queue_timeout = "2s"
max_inflight_requests = 8

[routing.health]
interval = 1
path = "/v1/models"
"""


def test_toml_tables_and_flags_override(tmp_path):
    path = tmp_path / "slogate.toml"
    path.write_text(TOML)
    cfg = build_config(merge(read_toml(path), {"routing.policy": "least-tokens"}))
    specs = upstream_specs(cfg)
    assert [(s.label, s.pool, s.weight, s.models) for s in specs] == [
        ("a", "default", 1.0, []), ("b", "long", 2.0, ["llama-3-70b"])]
    assert cfg.routing.policy == "least-tokens" and cfg.routing.queue_timeout == 2.0
    assert cfg.routing.max_inflight_requests == 8 and cfg.routing.health.path == "/v1/models"


@pytest.mark.parametrize("data, message", [
    ({"upstreams": ["http://a:1"], "routing": {"policy": "fastest"}}, "gateway.routing.policy (--policy)"),
    ({"upstreams": ["http://a:1"], "routing": {"polcy": "x"}}, "unknown key 'polcy'"),
    ({"upstreams": ["http://a:1"], "routing": {"pools": ["long: tokens > 1"]}}, "unknown variable"),
    ({"upstreams": ["http://a:1"], "routing": {"pools": ["long: max_tokens > 1"]}}, "no upstream is in pool 'long'"),
    ({"upstreams": ["http://a:1#weight=-1"]}, "weight"),
    ({"upstream": [{"url": "http://a:1", "colour": "red"}]}, "colour"),
    ({"upstreams": ["http://a:1"], "routing": {"health": {"intervall": 1}}}, "gateway.routing.health"),
    # accepted silently before: a first ejection longer than the cap, a health check that never times out,
    # an empty priority header name
    ({"upstreams": ["http://a:1"], "routing": {"health": {"eject_base": 100, "eject_max": 1}}},
     "gateway.routing.health.eject_base: expected at most health.eject_max (1 s)"),
    ({"upstreams": ["http://a:1"], "routing": {"health": {"timeout": float("inf")}}},
     "gateway.routing.health.timeout: expected a positive, finite number of seconds"),
    ({"upstreams": ["http://a:1"], "routing": {"priority_header": " "}}, "gateway.routing.priority_header"),
])
def test_bad_routing_config_names_the_key(data, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config(data)


def test_cli_flags_reach_the_config_and_errors_exit_2(capsys):
    args = cli.build_parser().parse_args([
        "--upstream", "http://a:1", "--upstream", "http://b:1#pool=long", "--policy", "round-robin",
        "--pool", "long: prompt_tokens >= 10", "--max-inflight-tokens", "5000", "--queue-size", "3",
        "--queue-timeout", "500ms", "--health-interval", "0", "--retries", "1", "--scrape-upstream-metrics"])
    cfg = build_config(merge({}, cli.overrides(args)))
    r = cfg.routing
    assert (r.policy, r.pools, r.max_inflight_tokens, r.queue_size, r.queue_timeout, r.health.interval,
            r.retries, r.scrape_upstream_metrics) == (
        "round-robin", ["long: prompt_tokens >= 10"], 5000, 3, 0.5, 0.0, 1, True)
    assert cli.main(["--upstream", "http://a:1", "--pool", "long: prompt_tokens >>= 1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--pool 'long: prompt_tokens >>= 1'" in err


async def _no_serve(cfg: object) -> None:  # a config wrongly accepted must fail the test, never serve
    return None


def test_upstream_in_a_pool_no_rule_names(capsys, monkeypatch):
    monkeypatch.setattr("slogate.gateway.server.serve", _no_serve)
    up = ["--upstream", "http://127.0.0.1:19400", "--upstream", "http://127.0.0.1:19403#pool=long"]
    assert cli.main(up) == 2
    err = capsys.readouterr().err.strip()
    assert "pool 'long'" in err and "--pool 'long: " in err and "\n" not in err
    with pytest.raises(UsageError, match="pool 'long'"):
        build_config({"upstreams": ["http://a:1"], "upstream": [{"url": "http://b:1", "pool": "long"}]})
    args = cli.build_parser().parse_args([*up, "--pool", "long: max_tokens >= 2048"])
    assert build_config(merge({}, cli.overrides(args))).routing.pools == ["long: max_tokens >= 2048"]


@pytest.mark.parametrize("data, message", [
    ({"routing.max_inflight_tokens": 2 ** 64}, "gateway.routing.max_inflight_tokens (--max-inflight-tokens)"),
    ({"routing.max_inflight_requests": 2 ** 62 + 1}, "gateway.routing.max_inflight_requests (--max-inflight-requests)"),
    ({"upstreams": ["http://a:1#max_inflight_requests=18446744073709551616"]}, "max_inflight_requests must be"),
    ({"upstream": [{"url": "http://b:1", "max_inflight_tokens": 2 ** 63 - 1}]}, "[[upstream]] #1: max_inflight_tokens"),
])
def test_limits_fit_the_shared_slots(data, message):
    with pytest.raises(UsageError) as err:
        build_config(merge({"upstreams": ["http://a:1"]}, data))
    assert message in str(err.value) and "at most 2**62" in str(err.value)
    cfg = build_config(merge({"upstreams": ["http://a:1#max_inflight_tokens=4611686018427387904"]},
                             {"routing.max_inflight_requests": 2 ** 62}))
    assert cfg.routing.max_inflight_requests == 2 ** 62


def test_trust_header_from_none_with_networks_is_an_error(capsys):
    """`none` was dropped and the networks kept: the opposite of what `none` says."""
    assert cli.main(["--upstream", "http://a:1", "--trust-header-from", "none", "--trust-header-from", "10.0.0.0/8"]) == 2
    assert "--trust-header-from none trusts no client" in capsys.readouterr().err
