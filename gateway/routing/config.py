"""Routing configuration: the `[routing]` table (or `--policy`, `--pool`, ... flags) as one Struct.

`check_routing(cfg, specs)` validates it against the upstream list and raises UsageError naming
the key and the fix. Pure: never touches the network or the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from slogate.gateway.routing.health import HealthConfig
from slogate.gateway.routing.policies import POLICIES
from slogate.gateway.routing.pools import PoolRule, parse_rules
from slogate.gateway.routing.upstreams import DEFAULT_POOL, MAX_LIMIT, MAX_LIMIT_TEXT, UpstreamSpec
from slogate.traces.usage import UsageError


class RoutingConfig(msgspec.Struct, forbid_unknown_fields=True):
    policy: str | None = None  # None: least-tokens (the only choice that matters with several upstreams)
    pools: list[str] = []  # rules "NAME: EXPR", first match wins; else pool "default"
    max_inflight_requests: int | None = None  # per upstream (an upstream's own value wins)
    max_inflight_tokens: int | None = None
    queue_size: int = 1024  # waiters per group when all its upstreams are full; 0: reject at once
    queue_timeout: float = 30.0
    priority_header: str = "x-slogate-priority"
    retries: int = 2  # extra attempts on other upstreams, only before any byte reached the client
    scrape_upstream_metrics: bool = False
    scrape_interval: float = 1.0
    scrape_stale_after: float = 5.0
    affinity_prefix_bytes: int = 1024
    affinity_epsilon: float = 0.25  # bounded load: ≤ (1+ε)·average in-flight tokens per weight
    bytes_per_token: float = 4.0
    tokenizer: str | None = None  # a Hugging Face tokenizer.json (needs the `tokenizers` package)
    seed: int | None = None  # power-of-two RNG
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)


# Routing key -> command-line flag (for error messages).
FLAGS: dict[str, str] = {
    "policy": "--policy",
    "pools": "--pool",
    "max_inflight_requests": "--max-inflight-requests",
    "max_inflight_tokens": "--max-inflight-tokens",
    "queue_size": "--queue-size",
    "queue_timeout": "--queue-timeout",
    "retries": "--retries",
    "scrape_upstream_metrics": "--scrape-upstream-metrics",
    "health.interval": "--health-interval",
    "health.path": "--health-path",
}


def _bad(key: str, value: object, hint: str) -> UsageError:
    flag = f" ({FLAGS[key]})" if key in FLAGS else ""
    return UsageError(f"gateway.routing.{key}{flag}: expected {hint}, got {value!r}")


def check_routing(cfg: RoutingConfig, specs: Sequence[UpstreamSpec]) -> None:
    if cfg.policy is not None and cfg.policy not in POLICIES:
        raise _bad("policy", cfg.policy, f"one of {', '.join(POLICIES)}")
    rules = parse_rules(cfg.pools)
    pools = {s.pool for s in specs}
    for rule in rules:
        if rule.pool not in pools:
            raise UsageError(
                f"--pool {rule.text!r}: no upstream is in pool {rule.pool!r}; "
                f"add one with --upstream URL#pool={rule.pool} (pools now: {', '.join(sorted(pools))})"
            )
    if DEFAULT_POOL not in pools:
        raise UsageError(
            f"no upstream is in pool {DEFAULT_POOL!r}, which gets the requests no --pool rule matches; "
            f"give one upstream #pool={DEFAULT_POOL} (pools now: {', '.join(sorted(pools))})"
        )
    _check_pools_ruled(rules, specs)
    names = [s.label for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UsageError(f"--upstream: two upstreams are named {sorted(dup)[0]!r}; give each a distinct #name=")
    for key in ("max_inflight_requests", "max_inflight_tokens"):
        value = getattr(cfg, key)
        if value is not None and not 0 < value <= MAX_LIMIT:
            raise _bad(key, value, f"a positive integer, at most {MAX_LIMIT_TEXT}")
    for key, low in (("queue_size", 0), ("retries", 0), ("affinity_prefix_bytes", 1)):
        if getattr(cfg, key) < low:
            raise _bad(key, getattr(cfg, key), f"an integer ≥ {low}")
    for key in ("queue_timeout", "scrape_interval", "scrape_stale_after", "bytes_per_token"):
        value = getattr(cfg, key)
        if not (value > 0 and math.isfinite(value)):
            raise _bad(key, value, "a positive number")
    if not 0 <= cfg.affinity_epsilon < 100:
        raise _bad("affinity_epsilon", cfg.affinity_epsilon, "a number ≥ 0, e.g. 0.25")
    h = cfg.health
    if h.interval is not None and not (h.interval >= 0 and math.isfinite(h.interval)):
        raise _bad("health.interval", h.interval, "a number of seconds ≥ 0 (0 turns active checks off)")
    if not h.path.startswith("/"):
        raise _bad("health.path", h.path, 'a path starting with "/", e.g. "/health"')
    for key in ("healthy_threshold", "unhealthy_threshold", "eject_after"):
        if getattr(h, key) < 1:
            raise _bad(f"health.{key}", getattr(h, key), "an integer ≥ 1")
    for key in ("timeout", "eject_base", "eject_max"):
        if not 0 < getattr(h, key) < math.inf:
            raise _bad(f"health.{key}", getattr(h, key), "a positive, finite number of seconds")
    if h.eject_base > h.eject_max:
        raise _bad("health.eject_base", h.eject_base, f"at most health.eject_max ({h.eject_max:g} s): the first "
                   "ejection is eject_base, each next one doubles up to eject_max")
    if not cfg.priority_header.strip():
        raise _bad("priority_header", cfg.priority_header, 'a header name, e.g. "x-slogate-priority"')


def _check_pools_ruled(rules: Sequence[PoolRule], specs: Sequence[UpstreamSpec]) -> None:
    """An upstream outside pool default that no rule names would never get an LLM request: refuse it."""
    named = {rule.pool for rule in rules}
    for spec in specs:
        if spec.pool != DEFAULT_POOL and spec.pool not in named:
            rules_now = ", ".join(repr(rule.text) for rule in rules) or "none"
            raise UsageError(
                f"upstream {spec.label!r} is in pool {spec.pool!r}, which no --pool rule names, so no LLM request "
                f"would reach it; add a rule, e.g. --pool '{spec.pool}: prompt_tokens >= 4096', or drop "
                f"pool={spec.pool} (rules now: {rules_now})"
            )


def routing_from_dict(data: dict) -> RoutingConfig:
    """The `[routing]` table -> RoutingConfig; UsageError names an unknown or mistyped key."""
    try:
        return msgspec.convert(data, RoutingConfig)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith("Object contains unknown field"):
            field = text.split("`")[1]
            struct = HealthConfig if "$.health" in text else RoutingConfig
            where = "gateway.routing.health" if struct is HealthConfig else "gateway.routing"
            raise UsageError(f"{where}: unknown key {field!r}; allowed keys: "
                             f"{', '.join(struct.__struct_fields__)}") from None
        raise UsageError(f"gateway.routing: {text}") from None


def specs_from(upstreams: Sequence[str], tables: Sequence[dict | UpstreamSpec]) -> list[UpstreamSpec]:
    """`--upstream` strings plus `[[upstream]]` tables -> validated specs (flags first)."""
    from slogate.gateway.routing.upstreams import check_spec, parse_upstream

    specs = [parse_upstream(u) for u in upstreams]
    for i, table in enumerate(tables):
        where = f"[[upstream]] #{i + 1}"
        if isinstance(table, UpstreamSpec):
            spec = table
        else:
            try:
                spec = msgspec.convert(table, UpstreamSpec)
            except msgspec.ValidationError as exc:
                raise UsageError(f"{where}: {exc}; keys: {', '.join(UpstreamSpec.__struct_fields__)}") from None
        specs.append(check_spec(spec, where=where))
    return specs
