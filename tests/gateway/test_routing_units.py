"""Pure routing logic: upstream syntax, pool grammar, policies, the affinity ring, health, admission."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from slogate.gateway.routing import health
from slogate.gateway.routing.admission import AdmissionQueue, Rejected, parse_priority
from slogate.gateway.routing.config import RoutingConfig, check_routing, routing_from_dict, specs_from
from slogate.gateway.routing.policies import Group, PrefixAffinity, make_policy, prefix_key
from slogate.gateway.routing.pools import parse_rule, parse_rules, pool_for
from slogate.gateway.routing.router import Router
from slogate.gateway.routing.scrape import parse_engine_load
from slogate.gateway.routing.upstreams import Lease, UpstreamSpec, UpstreamState, host_port, parse_upstream
from slogate.traces.request_info import request_info
from slogate.traces.usage import UsageError


def states(*weights: float, pool: str = "default") -> list[UpstreamState]:
    return [UpstreamState(UpstreamSpec(url=f"http://10.0.0.{i}:8000", pool=pool, weight=w), i)
            for i, w in enumerate(weights)]


def chat(prompt_chars: int = 40, max_tokens: int | None = 16, model: str = "m", text: str | None = None):
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": text or "x" * prompt_chars}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return request_info("/v1/chat/completions", body), body


# ------------------------------------------------------------------ upstreams
def test_parse_upstream_fragment_syntax():
    spec = parse_upstream("http://gpu1:8000#pool=long,weight=2,name=h100-a,models=a|b,max_inflight_requests=8")
    assert (spec.url, spec.pool, spec.weight, spec.label, spec.models, spec.max_inflight_requests) == (
        "http://gpu1:8000", "long", 2.0, "h100-a", ["a", "b"], 8)
    assert parse_upstream("http://u:p@host:9/v1").label == "host:9"
    assert host_port("https://example.com/x") == "example.com:443"
    for bad in ("http://h:1#pool", "http://h:1#colour=red", "http://h:1#weight=0", "http://h:1#weight=x",
                "ftp://h", "http://h:1#pool=a b", "http://h:1#name=a,name=b"):  # (the last name won)
        with pytest.raises(UsageError):
            parse_upstream(bad)


def test_specs_from_tables_and_routing_checks():
    specs = specs_from(["http://a:1"], [{"url": "http://b:2", "pool": "long", "weight": 2}])
    assert [s.pool for s in specs] == ["default", "long"]
    check_routing(RoutingConfig(pools=["long: prompt_tokens >= 4096"]), specs)
    with pytest.raises(UsageError, match="no upstream is in pool 'short'"):
        check_routing(RoutingConfig(pools=["short: prompt_tokens < 10"]), specs)
    with pytest.raises(UsageError, match="policy"):
        check_routing(RoutingConfig(policy="fastest"), specs)
    with pytest.raises(UsageError, match="distinct"):
        check_routing(RoutingConfig(), specs_from(["http://a:1", "http://a:1"], []))
    with pytest.raises(UsageError, match="pool 'default'"):
        check_routing(RoutingConfig(), specs_from(["http://a:1#pool=x"], []))
    with pytest.raises(UsageError, match="unknown key 'polcy'"):
        routing_from_dict({"polcy": "x"})
    with pytest.raises(UsageError, match="upstream"):
        specs_from([], [{"url": "http://b:2", "colour": 1}])


# ---------------------------------------------------------------------- pools
def test_pool_grammar():
    rule = parse_rule("long: prompt_tokens >= 4096 or max_tokens >= 2048")
    assert rule.matches(4096, 10) and rule.matches(10, 2048) and not rule.matches(4095, 2047)
    both = parse_rule("mid: prompt_tokens > 100 and prompt_tokens <= 1_000 or max_tokens == 7")
    assert both.matches(500, 1) and not both.matches(1001, 1) and both.matches(5000, 7)
    rules = parse_rules(["long: prompt_tokens >= 4096", "mid: max_tokens > 512"])
    assert [pool_for(rules, p, m) for p, m in ((5000, 10), (10, 1000), (10, 10))] == ["long", "mid", "default"]


@pytest.mark.parametrize("text, why", [
    ("prompt_tokens >= 4", "pool name"),
    ("long: prompt_tokens >= ", "incomplete"),
    ("long: tokens >= 4", "unknown variable 'tokens'"),
    ("long: prompt_tokens => 4", "unexpected text|operator"),
    ("long: prompt_tokens >= x", "integer"),
    ("long: prompt_tokens >= 4 xor max_tokens > 1", "'and' or 'or'"),
    ("long: __import__('os')", "unexpected text|unknown variable"),
    ("default: max_tokens > 1", "default"),
    ("long:", "empty"),
])
def test_pool_grammar_errors_name_the_rule(text, why):
    with pytest.raises(UsageError, match=why) as err:
        parse_rule(text)
    assert repr(text) in str(err.value)


def test_duplicate_pool_rules():
    with pytest.raises(UsageError, match="two rules"):
        parse_rules(["a: max_tokens > 1", "a: max_tokens > 2"])


# ------------------------------------------------------------------- policies
def test_least_tokens_and_requests_respect_weights():
    a, b, c = states(1, 2, 1)
    group = Group("default", [a, b, c])
    a.inflight_tokens, b.inflight_tokens, c.inflight_tokens = 100, 150, 90
    assert make_policy("least-tokens").choose(group, [a, b, c], None, 10, 0.0) is b  # 75 per weight
    a.inflight_requests, b.inflight_requests, c.inflight_requests = 1, 3, 2
    assert make_policy("least-requests").choose(group, [a, b, c], None, 10, 0.0) is a


def test_least_tokens_ties_rotate():
    ss = states(1, 1, 1)
    group = Group("default", ss)
    policy = make_policy("least-tokens")
    picks = collections.Counter(policy.choose(group, ss, None, 1, 0.0).name for _ in range(30))
    assert set(picks.values()) == {10}


def test_least_tokens_scrape_correction_ignores_stale_data():
    a, b = states(1, 1)
    group = Group("default", [a, b])
    a.inflight_tokens, b.inflight_tokens = 100, 120
    a.scraped_waiting, a.scraped_kv_usage, a.scraped_at = 5, 0.9, 99.0
    corrected = make_policy("least-tokens", scrape_stale_s=5.0)
    assert corrected.choose(group, [a, b], None, 50, 100.0) is b
    assert corrected.choose(group, [a, b], None, 50, 200.0) is a  # stale: ignored


def test_smooth_weighted_round_robin():
    a, b, c = states(3, 1, 1)
    group = Group("default", [a, b, c])
    policy = make_policy("round-robin")
    seq = [policy.choose(group, [a, b, c], None, 1, 0.0).name for _ in range(10)]
    assert collections.Counter(seq) == {a.name: 6, b.name: 2, c.name: 2}
    assert seq[:5].count(a.name) == 3  # interleaved, not a burst of a
    assert policy.choose(group, [b, c], None, 1, 0.0) in (b, c)  # a is skipped when not eligible


def test_power_of_two_is_seeded_and_prefers_lighter():
    ss = states(1, 1, 1, 1)
    group = Group("default", ss)
    for i, s in enumerate(ss):
        s.inflight_tokens = 1000 * i
    p1, p2 = make_policy("power-of-two", seed=7), make_policy("power-of-two", seed=7)
    picks1 = [p1.choose(group, ss, None, 1, 0.0).name for _ in range(200)]
    picks2 = [p2.choose(group, ss, None, 1, 0.0).name for _ in range(200)]
    assert picks1 == picks2
    counts = collections.Counter(picks1)
    assert counts[ss[0].name] > counts[ss[1].name] > counts[ss[2].name] and ss[3].name not in counts


def test_prefix_affinity_is_sticky_consistent_and_bounded():
    ss = states(1, 1, 1, 1)
    group = Group("default", ss)
    policy = PrefixAffinity(epsilon=0.25)
    keys = [prefix_key(f"system prompt {i}".encode() * 50) for i in range(400)]
    owners = [policy.choose(group, ss, k, 10, 0.0) for k in keys]
    assert owners == [policy.choose(group, ss, k, 10, 0.0) for k in keys]  # sticky
    assert min(collections.Counter(o.name for o in owners).values()) > 50  # spread by the ring
    # Removing one upstream moves only its keys (consistent hashing).
    rest = ss[1:]
    moved = sum(1 for k, o in zip(keys, owners, strict=True)
                if o is not ss[0] and policy.choose(group, rest, k, 10, 0.0) is not o)
    assert moved == 0
    # Bounded load: a hot prefix overflows to the next ring member once its owner is loaded.
    hot = keys[0]
    owner = owners[0]
    owner.inflight_tokens = 10_000
    other = policy.choose(group, ss, hot, 10, 0.0)
    assert other is not owner
    assert prefix_key(b"") is None
    assert prefix_key(b"a" * 1024 + b"x") == prefix_key(b"a" * 1024 + b"y")


# --------------------------------------------------------------- accounting
def test_lease_draws_down_and_releases():
    (s,) = states(1)
    lease = Lease(s, prompt_tokens=100, output_tokens=50, pool="default")
    assert (s.inflight_requests, s.inflight_tokens) == (1, 150)
    lease.on_tokens(30)
    assert s.inflight_tokens == 120
    lease.on_tokens(40)  # more than expected: never below the prompt
    assert s.inflight_tokens == 100
    assert lease.close() is s and lease.close() is None
    assert (s.inflight_requests, s.inflight_tokens) == (0, 0)


def test_passive_ejection_backoff_and_return():
    (s,) = states(1)
    cfg = health.HealthConfig(eject_after=2, eject_base=1.0, eject_max=3.0)
    assert not health.passive(s, health.HTTP_5XX, 0.0, cfg)
    assert health.passive(s, health.HTTP_5XX, 0.0, cfg) and s.ejected_until == 1.0
    assert not s.eligible(0.5) and s.eligible(1.0)
    assert health.passive(s, health.CONNECT_ERROR, 1.0, cfg) and s.ejected_until == 3.0  # doubled
    assert health.passive(s, health.CONNECT_ERROR, 3.0, cfg) and s.ejected_until == 6.0  # capped at 3
    assert not health.passive(s, health.OTHER, 6.0, cfg)
    health.passive(s, health.OK, 6.0, cfg)
    assert s.backoff_s == 0 and s.fail_streak == 0


def test_active_checks_thresholds():
    (s,) = states(1)
    cfg = health.HealthConfig(healthy_threshold=2, unhealthy_threshold=2)
    assert health.active_result(s, False, cfg) is None and s.healthy
    assert health.active_result(s, False, cfg) is False and not s.healthy
    assert health.active_result(s, True, cfg) is None and not s.healthy
    assert health.active_result(s, True, cfg) is True and s.healthy


def test_scrape_parser_understands_engines():
    vllm = (b'# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n'
            b'vllm:num_requests_waiting{model_name="a"} 3.0\nvllm:num_requests_waiting{model_name="b"} 1.0\n'
            b'vllm:kv_cache_usage_perc{model_name="a"} 0.5\nvllm:num_requests_running{model_name="a"} 9\n')
    assert parse_engine_load(vllm) == (4.0, 0.5)
    assert parse_engine_load(b"sglang:num_queue_reqs{m=\"x\"} 2\nsglang:token_usage{m=\"x\"} 0.28\n") == (2.0, 0.28)
    assert parse_engine_load(b"llamacpp:requests_deferred 5\n") == (5.0, 0.0)
    assert parse_engine_load(b"other_metric 1\n") is None


# --------------------------------------------------------------- admission
async def test_admission_queue_priority_then_fifo_and_timeout():
    q = AdmissionQueue(max_size=3)
    order: list[str] = []

    async def waiter(name: str, prio: int) -> None:
        if await q.wait(prio, q.next_seq(), 5.0):
            order.append(name)

    tasks = [asyncio.create_task(waiter(n, p)) for n, p in (("a", 0), ("b", 0), ("c", 5))]
    await asyncio.sleep(0.01)
    assert q.depth == 3 and q.full()
    while q.wake():
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["c", "a", "b"] and q.depth == 0
    t0 = time.monotonic()
    assert not await q.wait(0, q.next_seq(), 0.05)
    assert 0.04 < time.monotonic() - t0 < 1 and q.depth == 0
    assert not q.wake()
    assert parse_priority("7") == 7 and parse_priority("x") == 0 and parse_priority(None) == 0


async def test_router_admission_limits_queue_and_reject():
    specs = [UpstreamSpec(url="http://a:1"), UpstreamSpec(url="http://b:1")]
    router = Router(specs, RoutingConfig(max_inflight_requests=1, queue_size=1, queue_timeout=0.2))
    info, body = chat()
    l1 = await router.acquire(router.request(info, body))
    l2 = await router.acquire(router.request(info, body))
    assert {l1.upstream.name, l2.upstream.name} == {"a:1", "b:1"}
    waiting = asyncio.create_task(router.acquire(router.request(info, body)))
    await asyncio.sleep(0.02)
    assert dict(router.queue_depths()) == {"default": 1}
    with pytest.raises(Rejected) as full:  # queue holds one
        await router.acquire(router.request(info, body))
    assert full.value.reason == "queue_full"
    freed = l1.upstream
    router.release(l1)
    l3 = await waiting
    assert l3.upstream is freed and l3.queue_s > 0.0
    with pytest.raises(Rejected) as late:
        await router.acquire(router.request(info, body))
    assert late.value.reason == "queue_timeout" and late.value.retry_after_s == 1 and late.value.queue_s >= 0.19
    assert router.metrics.rejections == {("default", "queue_full"): 1, ("default", "queue_timeout"): 1}


async def test_router_token_limit_admits_by_tokens_not_requests():
    router = Router([UpstreamSpec(url="http://a:1")], RoutingConfig(max_inflight_tokens=1000, queue_size=0))
    big = chat(prompt_chars=400, max_tokens=600)  # ~700 tokens in flight
    small = chat(prompt_chars=40, max_tokens=100)
    l1 = await router.acquire(router.request(*big))
    with pytest.raises(Rejected) as full:  # a second big one would pass 1000 tokens
        await router.acquire(router.request(*big))
    assert full.value.reason == "queue_full"
    l2 = await router.acquire(router.request(*small))  # a small one still fits under the token limit
    router.release(l1)
    l3 = await router.acquire(router.request(*big))
    router.release(l2)
    router.release(l3)
    assert router.states[0].inflight_tokens == 0 and router.states[0].inflight_requests == 0


async def test_router_token_limit_and_pools_and_models():
    specs = [UpstreamSpec(url="http://s:1"), UpstreamSpec(url="http://l:1", pool="long"),
             UpstreamSpec(url="http://e:1", models=["embed"])]
    router = Router(specs, RoutingConfig(pools=["long: prompt_tokens >= 1000 or max_tokens >= 2000"]))
    short = router.request(*chat(prompt_chars=400))
    assert short.pool == "default" and {s.name for s in short.group.members} == {"s:1"}
    long = router.request(*chat(prompt_chars=4000))
    assert long.pool == "long" and router.choose(long).name == "l:1"
    assert router.request(*chat(max_tokens=5000)).pool == "long"
    assert router.choose(router.request(*chat(model="embed"))).name == "e:1"
    assert router.request(None).bypass


async def test_router_retry_only_for_retryable_and_bounded():
    specs = [UpstreamSpec(url=f"http://u{i}:1") for i in range(4)]
    router = Router(specs, RoutingConfig(retries=2, policy="round-robin"))
    req = router.request(*chat())
    lease = await router.acquire(req)
    first = lease.upstream
    lease2 = router.retry(req, lease, health.CONNECT_ERROR)
    assert lease2 is not None and lease2.upstream is not first and not first.eligible(time.monotonic())
    lease3 = router.retry(req, lease2, health.HTTP_503)
    assert lease3 is not None and lease3.upstream not in (first, lease2.upstream)
    assert router.retry(req, lease3, health.HTTP_503) is None  # bounded: 2 retries
    req2 = router.request(*chat())
    lease = await router.acquire(req2)
    assert router.retry(req2, lease, health.TIMEOUT) is None  # not retryable
    assert all(s.inflight_requests == 0 and s.inflight_tokens == 0 for s in router.states)
    assert sum(router.metrics.retries.values()) == 2
    assert {k: n for k, n in router.metrics.ejections.items() if n} == {(first.name, health.CONNECT_ERROR): 1}
    assert router.metrics.ejections[(first.name, health.HTTP_5XX)] == 0  # known label sets start at 0


async def test_router_fails_open_and_readiness():
    specs = [UpstreamSpec(url="http://a:1"), UpstreamSpec(url="http://b:1", pool="long")]
    router = Router(specs, RoutingConfig(pools=["long: prompt_tokens >= 100"]))
    assert router.ready()
    b = router.by_name["b:1"]
    b.healthy = False
    assert not router.ready()
    req = router.request(*chat(prompt_chars=4000))
    assert router.choose(req) is b and "failing open" in b.last_reason
    status = router.status()
    assert status["pools"]["long"]["healthy"] == 0 and status["upstreams"][1]["healthy"] is False


async def test_single_upstream_never_ejects():
    router = Router([UpstreamSpec(url="http://a:1")], RoutingConfig())
    req = router.request(*chat())
    lease = await router.acquire(req)
    assert router.retry(req, lease, health.CONNECT_ERROR) is None
    assert router.ready() and router.health_interval == 0


def test_outcome_of_maps_gateway_errors():
    o = health.outcome_of
    assert o(200, None, started=True) == health.OK
    assert o(502, "connect", started=False) == health.CONNECT_ERROR
    assert o(504, "timeout_connect", started=False) == health.CONNECT_ERROR
    assert o(502, "reset", started=False) == health.RESET_BEFORE_RESPONSE
    assert o(200, "reset", started=True) == health.HTTP_5XX
    assert o(503, "upstream_status", started=True) == health.HTTP_503
    assert o(503, None, started=False) == health.HTTP_503
    assert o(502, "protocol", started=False) == health.HTTP_5XX
    assert o(500, "upstream_status", started=True) == health.HTTP_5XX
    assert o(500, None, started=True) == health.HTTP_5XX
    assert o(504, "timeout_ttfb", started=False) == health.TIMEOUT
    assert o(404, "upstream_status", started=True) == health.OTHER
    assert o(503, "shutdown", started=False) == health.OTHER
    assert o(200, "stream_error_event", started=True) == health.OTHER
    assert o(499, "client_disconnect", started=True) == health.OTHER
