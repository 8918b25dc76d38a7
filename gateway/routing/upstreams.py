"""Upstreams as the router sees them: `UpstreamSpec` (configuration) and `UpstreamState` (live load).

`UpstreamState` and `Lease` hold plain ints and floats mutated synchronously on the event loop by
the relay (one subtraction per streamed chunk); they never await, allocate per chunk or do I/O.
"""

from __future__ import annotations

import math
import re

import msgspec

from slogate.traces.usage import UsageError

DEFAULT_POOL = "default"
EWMA_ALPHA = 0.2  # weight of the newest sample in the TTFT/TPOT moving averages
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_FRAGMENT_KEYS = ("name", "pool", "weight", "models", "max_inflight_requests", "max_inflight_tokens")


class UpstreamSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One upstream server: `[[upstream]]` in TOML or `--upstream URL[#pool=long,weight=2,name=a]`."""

    url: str
    name: str | None = None  # metrics/trace label; host:port by default
    pool: str = DEFAULT_POOL
    weight: float = 1.0  # relative capacity (e.g. 2 for an H100 next to an A100)
    models: list[str] = []  # models it serves; empty: any model
    max_inflight_requests: int | None = None  # admission limit (overrides the global one)
    max_inflight_tokens: int | None = None

    @property
    def label(self) -> str:
        return self.name or host_port(self.url)


def host_port(url: str) -> str:
    """`http://user:pw@host:8000/v1` -> `host:8000` (never credentials or paths)."""
    rest = url.split("://", 1)[-1].split("/", 1)[0].split("#", 1)[0]
    rest = rest.rsplit("@", 1)[-1]
    if ":" not in rest.rsplit("]", 1)[-1]:
        rest += ":443" if url.startswith("https://") else ":80"
    return rest


def parse_upstream(text: str) -> UpstreamSpec:
    """Parse one `--upstream` value: `URL` or `URL#key=value,key=value`.

    Keys: name, pool, weight, models (separated by `|`), max_inflight_requests, max_inflight_tokens.
    A `#` fragment never reaches the upstream (it is not part of an HTTP request path).
    """
    url, _, fragment = text.partition("#")
    fields: dict[str, object] = {"url": url}
    for item in filter(None, (p.strip() for p in fragment.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in _FRAGMENT_KEYS:
            raise UsageError(
                f"--upstream {text!r}: bad option {item!r}; use URL#pool=NAME,weight=N,name=LABEL,"
                f"models=a|b,max_inflight_requests=N,max_inflight_tokens=N"
            )
        value = value.strip()
        if key in fields:
            raise UsageError(f"--upstream {text!r}: {key} is given twice (the last would win); give it once")
        if key == "models":
            fields[key] = [m for m in value.split("|") if m]
        elif key == "weight":
            fields[key] = _number(text, key, value, float)
        elif key.startswith("max_"):
            fields[key] = _number(text, key, value, int)
        else:
            fields[key] = value
    return check_spec(msgspec.convert(fields, UpstreamSpec), where=f"--upstream {text!r}")


def _number(text: str, key: str, value: str, kind: type) -> float | int:
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"--upstream {text!r}: {key} must be a number, got {value!r}") from None


# Largest in-flight limit: the shared slots of --workers (routing/shared_state.py) are signed 64-bit, and a
# limit plus one request over it must still fit in them.
MAX_LIMIT = 1 << 62
MAX_LIMIT_TEXT = f"2**62 ({MAX_LIMIT})"


def check_spec(spec: UpstreamSpec, *, where: str) -> UpstreamSpec:
    """Validate one spec; UsageError names `where` and the bad field."""
    if not spec.url.startswith(("http://", "https://")) or not spec.url.split("://", 1)[1]:
        raise UsageError(f"{where}: url must start with http:// or https://, got {spec.url!r}")
    for key, value in (("name", spec.name), ("pool", spec.pool)):
        if value is not None and not _NAME.match(value):
            raise UsageError(f"{where}: {key} must be 1-64 characters of letters, digits, _ . : -, got {value!r}")
    if not (spec.weight > 0 and math.isfinite(spec.weight)):
        raise UsageError(f"{where}: weight must be a positive number, got {spec.weight!r}")
    for key in ("max_inflight_requests", "max_inflight_tokens"):
        value = getattr(spec, key)
        if value is not None and not 0 < value <= MAX_LIMIT:
            raise UsageError(f"{where}: {key} must be a positive integer, at most {MAX_LIMIT_TEXT}, got {value!r}")
    return spec


class UpstreamState:
    """Live accounting and health of one upstream, read by policies in O(1) attribute reads."""

    __slots__ = (
        "backoff_s",
        "check_fails",
        "ejected_until",
        "ejections",
        "fail_streak",
        "healthy",
        "index",
        "inflight_requests",
        "inflight_tokens",
        "last_reason",
        "max_requests",
        "max_tokens",
        "models",
        "name",
        "ok_streak",
        "pool",
        "scraped_at",
        "scraped_kv_usage",
        "scraped_waiting",
        "spec",
        "target",
        "tpot_ewma",
        "ttft_ewma",
        "weight",
    )

    def __init__(self, spec: UpstreamSpec, index: int, *, max_requests: int | None = None,
                 max_tokens: int | None = None) -> None:
        self.spec = spec
        self.index = index
        self.name = spec.label
        self.pool = spec.pool
        self.weight = spec.weight
        self.models = frozenset(spec.models)
        self.max_requests = spec.max_inflight_requests or max_requests
        self.max_tokens = spec.max_inflight_tokens or max_tokens
        self.target: object = None  # the gateway's client object for this upstream (session owner)
        self.inflight_requests = 0
        self.inflight_tokens = 0
        self.ttft_ewma: float | None = None
        self.tpot_ewma: float | None = None
        self.healthy = True  # active health checks
        self.ok_streak = 0  # consecutive good active checks
        self.check_fails = 0  # consecutive failed active checks
        self.fail_streak = 0  # consecutive failed requests (passive) or checks (active)
        self.ejected_until = 0.0  # monotonic seconds; passive ejection while now < ejected_until
        self.backoff_s = 0.0
        self.ejections = 0
        self.scraped_waiting = 0.0
        self.scraped_kv_usage = 0.0
        self.scraped_at = -math.inf  # monotonic seconds of the last good scrape
        self.last_reason = "not chosen yet"

    def eligible(self, now: float) -> bool:
        return self.healthy and now >= self.ejected_until

    def has_room(self, tokens: int) -> bool:
        """Under both admission limits (a request larger than the token limit may run alone)."""
        if self.max_requests is not None and self.inflight_requests >= self.max_requests:
            return False
        mt = self.max_tokens
        return mt is None or self.inflight_tokens + tokens <= mt or self.inflight_requests == 0

    def observe_latency(self, ttft: float | None, tpot: float | None) -> None:
        if ttft is not None:
            self.ttft_ewma = ttft if self.ttft_ewma is None else self.ttft_ewma + EWMA_ALPHA * (ttft - self.ttft_ewma)
        if tpot is not None:
            self.tpot_ewma = tpot if self.tpot_ewma is None else self.tpot_ewma + EWMA_ALPHA * (tpot - self.tpot_ewma)

    def status(self, now: float) -> dict:
        return {
            "name": self.name,
            "url": host_port(self.spec.url),
            "pool": self.pool,
            "weight": self.weight,
            "models": sorted(self.models) or None,
            "inflight_requests": self.inflight_requests,
            "inflight_tokens": self.inflight_tokens,
            "max_inflight_requests": self.max_requests,
            "max_inflight_tokens": self.max_tokens,
            "ttft_ewma_s": self.ttft_ewma,
            "tpot_ewma_s": self.tpot_ewma,
            "healthy": self.healthy,
            "ejected_for_s": round(self.ejected_until - now, 3) if now < self.ejected_until else 0.0,
            "ejections": self.ejections,
            "scraped": None if self.scraped_at == -math.inf else {
                "waiting": self.scraped_waiting, "kv_cache_usage": self.scraped_kv_usage,
                "age_s": round(now - self.scraped_at, 3)},
            "last_reason": self.last_reason,
        }


class Lease:
    """One request's claim on an upstream: prompt tokens plus remaining expected output tokens.

    The relay calls `on_tokens(n)` with each increase of the observer's output count (a few int
    operations) and the router's `release()` once at the end. Closing twice is a no-op.
    """

    __slots__ = ("attempt", "open", "pool", "prompt_tokens", "queue_s", "remaining_tokens", "upstream")

    def __init__(self, upstream: UpstreamState, prompt_tokens: int, output_tokens: int, pool: str,
                 queue_s: float = 0.0, attempt: int = 0) -> None:
        self.upstream = upstream
        self.prompt_tokens = prompt_tokens
        self.remaining_tokens = output_tokens
        self.pool = pool
        self.queue_s = queue_s
        self.attempt = attempt
        self.open = True
        upstream.inflight_requests += 1
        upstream.inflight_tokens += prompt_tokens + output_tokens

    def on_tokens(self, n: int) -> None:
        """`n` more output tokens were streamed: draw them down (never below zero)."""
        left = self.remaining_tokens
        if n > left:
            n = left
        self.remaining_tokens = left - n
        self.upstream.inflight_tokens -= n

    def close(self) -> UpstreamState | None:
        """Give the claim back; returns the upstream it was on (None when already closed)."""
        if not self.open:
            return None
        self.open = False
        state = self.upstream
        state.inflight_requests -= 1
        state.inflight_tokens -= self.prompt_tokens + self.remaining_tokens
        self.remaining_tokens = 0
        return state
