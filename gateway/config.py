"""The gateway's configuration: one `GatewayConfig` struct from `slogate.toml` and command-line flags.

Flags override the TOML file; both go through the same validation, and a bad value raises
`UsageError` naming the key (`gateway.timeouts.idle`) and what is allowed. Never touches the network.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import yarl

from slogate.gateway.routing.config import RoutingConfig, check_routing, specs_from
from slogate.gateway.routing.health import HealthConfig
from slogate.gateway.routing.upstreams import UpstreamSpec
from slogate.gateway.tokens import TEMPLATES
from slogate.traces.slo import Slo, SloError, parse_duration, parse_slo
from slogate.traces.toml_file import read_toml_file
from slogate.traces.usage import UsageError


class Timeouts(msgspec.Struct, forbid_unknown_fields=True):
    """Seconds; `inf` disables one."""

    connect: float = 5.0  # TCP connect to the upstream
    ttfb: float = 300.0  # request sent → first response byte (queueing + prefill)
    idle: float = 60.0  # gap between two response chunks
    total: float = 3600.0  # whole request


class ClientConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Limits on client connections to the proxy port (gateway/client_limits.py)."""

    header_timeout: float = 10.0  # first byte of a request header → its end
    body_timeout: float = 30.0  # request body, plus 1 s per `body_min_rate` bytes received
    body_min_rate: float = 16384.0  # bytes per second a slow body must keep up
    keepalive_timeout: float = 15.0  # idle connection between requests (and before the first)
    max_connections: int = 0  # open client connections; 0: the open-files limit less a reserve


class TraceConfig(msgspec.Struct, forbid_unknown_fields=True):
    dir: str | None = None  # no capture without a directory
    sample: float = 1.0  # fraction of measured requests written
    seed: int | None = None  # sampling RNG seed (None: random)
    salt_file: str | None = None  # SLOGATE_TRACE_SALT wins; created 0600 when missing
    flush_interval: float = 1.0
    rotate_bytes: int = 256 << 20
    rotate_seconds: float = 3600.0
    queue_size: int = 65536
    chunk_times: bool = False  # also store every chunk offset per request
    session_header: str | None = None  # request header naming the session (hashed with the salt, never stored)
    session_from: str = "header,user,prefix"  # session sources in order of precedence (gateway/sessions.py), or "off"
    session_window: float = 600.0  # a turn may follow its session's previous answer by at most this long


class TokensConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Exact input tokens when the upstream sends no usage (gateway/tokens.py)."""

    tokenizer: str | None = None  # a tokenizer.json, or the server's tokenize URL (…/tokenize, …/extras/tokenize)
    template: str = "none"  # chat template applied before counting: none, gemma, chatml, llama3


class GatewayConfig(msgspec.Struct, forbid_unknown_fields=True):
    listen: str = "0.0.0.0:8080"
    # /metrics, /slogate/status (and the probes): "auto" = 127.0.0.1:<listen port + 1>, "HOST:PORT", or "proxy"
    # (on `listen` beside the proxied paths: the opt-in to expose them on the public port)
    admin_listen: str = "auto"
    upstreams: list[str] = []  # URL or URL#pool=NAME,weight=N,name=LABEL (gateway/routing/upstreams.py)
    upstream: list[UpstreamSpec] = []  # [[upstream]] tables: url, name, pool, weight, models, limits
    slos: dict[str, str] = {}  # name -> "ttft=0.5,tpot=50ms"
    inject_usage: bool = True
    max_body_bytes: int = 32 << 20
    max_inflight_body_bytes: int = 256 << 20  # request-body bytes buffered at once; beyond it 503 (gateway/body_budget.py)
    shutdown_grace: float = 30.0
    workers: int | str = 1  # worker processes on one port (gateway/workers.py); "auto": one per core
    unready_after_errors: float = 30.0  # /readyz 503 once the upstream answered only failures this long
    max_connections_per_upstream: int = 1024
    # clients whose x-slogate-* headers count (and are forwarded); others' are dropped
    trust_header_from: list[str] = msgspec.field(default_factory=lambda: ["127.0.0.0/8", "::1/128"])
    max_model_labels: int = 32  # distinct `model` label values before folding into "other"
    expected_output_tokens: int = 256  # in-flight token estimate when max_tokens is absent
    loop_lag_interval: float = 0.5
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    client: ClientConfig = msgspec.field(default_factory=ClientConfig)
    trace: TraceConfig = msgspec.field(default_factory=TraceConfig)
    routing: RoutingConfig = msgspec.field(default_factory=RoutingConfig)
    tokens: TokensConfig = msgspec.field(default_factory=TokensConfig)
    # ---- ecosystem: semconv labels, logs, OTLP (issue 17)
    provider_name: str = "openai"  # gen_ai_provider_name label / gen_ai.provider.name attribute
    legacy_model_label: bool = False  # also emit the pre-semconv `model` label (one release)
    log_format: str = "text"  # "text" or "json" (one JSON line per lifecycle event)
    access_log: str | None = None  # PATH or "-" (stdout): one JSON line per request
    otel: bool = False  # export spans (and metrics) over OTLP; OTEL_* env vars configure the exporter


# What a value must look like, per key (used in error messages).
_HINTS: dict[str, str] = {
    "listen": 'a "HOST:PORT" address, e.g. "0.0.0.0:8080"',
    "admin_listen": '"auto" (127.0.0.1, the listen port + 1), "proxy" (on listen) or a "HOST:PORT" address, '
                    'e.g. "127.0.0.1:9090"',
    "upstreams": 'a list of URLs, e.g. ["http://127.0.0.1:8000", "http://10.0.0.2:8000#pool=long,weight=2"]',
    "upstream": 'tables [[upstream]] with url = "http://..." and optional name, pool, weight, models',
    "slos": 'a table NAME = "ttft=0.5,tpot=50ms,e2e=30"',
    "inject_usage": "true or false",
    "max_body_bytes": "a positive integer (bytes)",
    "max_inflight_body_bytes": "a positive integer (bytes), at least max_body_bytes",
    "shutdown_grace": "a non-negative number of seconds",
    "workers": 'an integer from 1 to 1024, or "auto" (one per core)',
    "unready_after_errors": "a positive number of seconds",
    "max_connections_per_upstream": "a positive integer",
    "max_model_labels": "a positive integer",
    "trust_header_from": 'a list of CIDR networks, e.g. ["10.0.0.0/8"] (an empty list: no client)',
    "expected_output_tokens": "a positive integer",
    "loop_lag_interval": "a positive number of seconds",
    "timeouts.connect": "a positive number of seconds",
    "timeouts.ttfb": "a positive number of seconds",
    "timeouts.idle": "a positive number of seconds",
    "timeouts.total": "a positive number of seconds",
    "client.header_timeout": "a positive number of seconds",
    "client.body_timeout": "a positive number of seconds",
    "client.keepalive_timeout": "a positive number of seconds",
    "client.body_min_rate": "a positive number (bytes per second)",
    "client.max_connections": "a non-negative integer (0: from the open-files limit)",
    "trace.dir": "a directory path",
    "trace.sample": "a fraction in (0, 1]",
    "trace.seed": "an integer",
    "trace.salt_file": "a file path",
    "trace.flush_interval": "a positive number of seconds",
    "trace.rotate_bytes": "a positive integer (bytes)",
    "trace.rotate_seconds": "a positive number of seconds",
    "trace.queue_size": "a positive integer",
    "trace.chunk_times": "true or false",
    "trace.session_header": 'a header name, e.g. "X-Session-Id"',
    "trace.session_from": 'a list of header, user, prefix (e.g. "header,prefix"), or "off"',
    "trace.session_window": "a positive number of seconds",
    "routing.queue_timeout": "a positive number of seconds",
    "routing.scrape_interval": "a positive number of seconds",
    "routing.scrape_stale_after": "a positive number of seconds",
    # ---- ecosystem (issue 17)
    "provider_name": 'a provider name, e.g. "openai" or "vllm"',
    "legacy_model_label": "true or false",
    "log_format": '"text" or "json"',
    "access_log": 'a file path or "-" for stdout',
    "otel": "true or false",
}
_DURATION_KEYS = {k for k, v in _HINTS.items() if "seconds" in v}
# The command-line flag for a key, so an error can name both.
FLAGS: dict[str, str] = {
    "listen": "--listen",
    "admin_listen": "--admin-listen",
    "upstreams": "--upstream",
    "slos": "--slo",
    "inject_usage": "--no-inject-usage",
    "max_body_bytes": "--max-body-bytes",
    "max_inflight_body_bytes": "--max-inflight-body-bytes",
    "shutdown_grace": "--shutdown-grace",
    "workers": "--workers",
    "unready_after_errors": "--unready-after-errors",
    "max_connections_per_upstream": "--max-connections",
    "trust_header_from": "--trust-header-from",
    "timeouts.connect": "--connect-timeout",
    "timeouts.ttfb": "--ttfb-timeout",
    "timeouts.idle": "--idle-timeout",
    "timeouts.total": "--total-timeout",
    "client.header_timeout": "--client-header-timeout",
    "client.body_timeout": "--client-body-timeout",
    "client.body_min_rate": "--client-body-min-rate",
    "client.keepalive_timeout": "--client-keepalive-timeout",
    "client.max_connections": "--max-client-connections",
    "trace.dir": "--trace-dir",
    "trace.sample": "--trace-sample",
    "trace.seed": "--trace-seed",
    "trace.salt_file": "--trace-salt-file",
    "trace.flush_interval": "--trace-flush-interval",
    "trace.rotate_bytes": "--trace-rotate-bytes",
    "trace.rotate_seconds": "--trace-rotate-seconds",
    "trace.queue_size": "--trace-queue-size",
    "trace.chunk_times": "--trace-chunk-times",
    "trace.session_header": "--session-header",
    "trace.session_from": "--session-from",
    "trace.session_window": "--session-window",
    "routing.queue_timeout": "--queue-timeout",
    "tokens.tokenizer": "--tokenizer",
    "tokens.template": "--chat-template",
    # ---- ecosystem (issue 17)
    "provider_name": "--provider-name",
    "legacy_model_label": "--legacy-model-label",
    "log_format": "--log-format",
    "access_log": "--access-log",
    "otel": "--otel",
}


def _bad(key: str, value: Any, hint: str | None = None) -> UsageError:
    flag = f" ({FLAGS[key]})" if key in FLAGS else ""
    hint = hint or _HINTS.get(key, "a valid value")
    return UsageError(f"gateway.{key}{flag}: expected {hint}, got {_show(value)}")


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _get(data: dict, dotted: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


# Tables read beside [gateway] as if written [[gateway.upstream]] / [gateway.routing] (never both ways).
_BESIDE_GATEWAY = ("upstream", "routing")
# Other commands' tables, skipped so one file can serve both: `slogate replay --config` reads only [replay].
_SKIPPED = ("replay",)
# `slogate sim --config` tables: that command refuses any other table, so it cannot share a file with [gateway].
_SIM_TABLES = ("sim", "server", "faults", "gpu", "model")
_TOP_SHOWN = {"gateway": "[gateway]", "upstream": "[[upstream]]", "routing": "[routing]", "replay": "[replay]"}
_ALLOWED = "beside [gateway] only [[upstream]], [routing] and [replay] (slogate replay's, skipped here) are read"


def read_toml(path: str | Path) -> dict[str, Any]:
    """The `[gateway]` table of a TOML file (a file holding only gateway keys is accepted too), with
    `[[upstream]]` / `[routing]` written beside it. Any other top-level table or key but `[replay]` is an
    error, and so is a table given both beside and inside [gateway]."""
    data = read_toml_file(path)
    if "gateway" not in data:
        unknown = sorted(set(data) - set(GatewayConfig.__struct_fields__))
        if unknown:
            raise UsageError(f"--config {path}: no [gateway] table (found: {', '.join(sorted(data))}){_close_top(unknown)}")
        return data
    table = data["gateway"]
    if not isinstance(table, dict):
        raise UsageError(f"--config {path}: [gateway] must be a table")
    for key, value in data.items():
        if key == "gateway" or key in _SKIPPED:
            continue
        if key not in _BESIDE_GATEWAY:
            raise _stray(path, key, value)
        if key in table:
            raise UsageError(f"--config {path}: both {_shown(key, value)} and {_shown('gateway.' + key, value)} "
                             "are given; merge them into one of the two")
        table = {**table, key: value}
    return table


def _shown(key: str, value: Any) -> str:
    """How a name reads in the file: `[[upstream]]` (an array of tables), `[routing]` (a table) or a plain key."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return f"[[{key}]]"
    return f"[{key}]" if isinstance(value, dict) else f"key {key!r}"


def _close_top(keys: list[str]) -> str:
    """"; did you mean [gateway] ...?" for a misspelt top-level table (empty when nothing is close)."""
    for key in keys:
        match = difflib.get_close_matches(key, ["gateway", *_BESIDE_GATEWAY], n=1)
        if match:
            return f"; did you mean {_TOP_SHOWN[match[0]]} instead of [{key}]?"
    return ""


def _stray(path: str | Path, key: str, value: Any) -> UsageError:
    """The error for a top-level table or key beside [gateway] that the gateway does not read."""
    where = f"--config {path}: top-level {_shown(key, value)}"
    if key in _SIM_TABLES:
        return UsageError(f"{where} belongs to a slogate sim --config file, which cannot hold [gateway]: "
                          f"give the simulator a file of its own ({_ALLOWED})")
    if key in GatewayConfig.__struct_fields__:
        return UsageError(f"{where} is outside [gateway] and would be ignored: write it {_under_gateway(key, value)}")
    match = difflib.get_close_matches(key, [*_TOP_SHOWN, *GatewayConfig.__struct_fields__], n=1)
    hint = f" (did you mean {_TOP_SHOWN.get(match[0]) or _under_gateway(match[0], value)}?)" if match else ""
    return UsageError(f"{where} is unknown{hint}; {_ALLOWED}")


def _under_gateway(key: str, value: Any) -> str:
    shown = _shown(key, value)
    return _shown(f"gateway.{key}", value) if shown.startswith("[") else f"{key} = ... under [gateway]"


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides (from flags; dotted keys like `timeouts.idle`) on top of the TOML table."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        parts = dotted.split(".")
        cur = out
        for part in parts[:-1]:
            nxt = cur.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                cur[part] = nxt
            cur = nxt
        cur[parts[-1]] = value
    return out


def build_config(data: dict[str, Any]) -> GatewayConfig:
    """Validate a merged dict into a GatewayConfig; UsageError names the first bad key."""
    data = _coerce_durations(data)
    try:
        cfg = msgspec.convert(data, GatewayConfig)
    except msgspec.ValidationError as exc:
        raise _translate(exc, data) from None
    _check(cfg)
    return cfg


def _check_sessions(trace: TraceConfig) -> None:
    from slogate.gateway.sessions import parse_sources

    try:
        parse_sources(trace.session_from)
    except ValueError:
        raise _bad("trace.session_from", trace.session_from) from None
    name = trace.session_header
    if name is not None and (not name or any(c in name for c in " :\t\r\n") or not name.isascii()):
        raise _bad("trace.session_header", name)


def _coerce_durations(data: dict[str, Any]) -> dict[str, Any]:
    """Accept "50ms"/"2s" strings for duration keys."""
    out = merge(data, {})
    for key in _DURATION_KEYS:
        value = _get(out, key)
        if isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except SloError:
                raise _bad(key, value) from None
            out = merge(out, {key: seconds})
    return out


def _translate(exc: msgspec.ValidationError, data: dict[str, Any]) -> UsageError:
    text = str(exc)
    path = ""
    if " - at `$." in text:
        text, path = text.split(" - at `$.", 1)
        path = path.rstrip("`")
    path = path.split("[", 1)[0]
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        struct = {"": GatewayConfig, "timeouts": Timeouts, "client": ClientConfig, "trace": TraceConfig, "upstream": UpstreamSpec,
                  "routing": RoutingConfig, "routing.health": HealthConfig}.get(path, GatewayConfig)
        where = f"gateway.{path}" if path else "gateway"
        allowed = ", ".join(struct.__struct_fields__)
        return UsageError(f"{where}: unknown key {field!r}; allowed keys: {allowed}")
    if path:
        return _bad(path, _get(data, path))
    return UsageError(f"gateway: {text}")


def _check(cfg: GatewayConfig) -> None:
    for key in _DURATION_KEYS:
        value = _get(msgspec.to_builtins(cfg), key)
        if isinstance(value, float | int) and (math.isnan(value) or value <= 0):
            if key == "shutdown_grace" and value == 0:
                continue
            raise _bad(key, value)
    for key in ("max_body_bytes", "max_connections_per_upstream", "max_model_labels", "expected_output_tokens"):
        if getattr(cfg, key) <= 0:
            raise _bad(key, getattr(cfg, key))
    if cfg.max_inflight_body_bytes < cfg.max_body_bytes:  # else a body the limit allows could never fit
        raise _bad("max_inflight_body_bytes", cfg.max_inflight_body_bytes)
    if not cfg.client.body_min_rate > 0:
        raise _bad("client.body_min_rate", cfg.client.body_min_rate)
    if cfg.client.max_connections < 0:
        raise _bad("client.max_connections", cfg.client.max_connections)
    for key in ("rotate_bytes", "queue_size"):
        if getattr(cfg.trace, key) <= 0:
            raise _bad(f"trace.{key}", getattr(cfg.trace, key))
    if not 0.0 < cfg.trace.sample <= 1.0:
        raise _bad("trace.sample", cfg.trace.sample)
    _check_sessions(cfg.trace)
    _check_trace_dir(cfg.trace.dir)
    _check_capture_options(cfg.trace)
    trusted_networks(cfg.trust_header_from)
    parse_hostport(cfg.listen, key="listen")
    admin_address(cfg)
    if not cfg.upstreams and not cfg.upstream:
        raise UsageError("gateway.upstreams (--upstream): give at least one upstream URL, e.g. --upstream http://127.0.0.1:8000")
    for url in cfg.upstreams:
        if not (url.startswith("http://") or url.startswith("https://")) or len(url.split("://", 1)[1]) == 0:
            raise _bad("upstreams", url, "URLs starting with http:// or https://")
    parse_slos(cfg.slos)
    if cfg.tokens.template not in TEMPLATES:
        raise _bad("tokens.template", cfg.tokens.template, ", ".join(TEMPLATES))
    if cfg.tokens.template != "none" and not cfg.tokens.tokenizer:
        raise UsageError(f"--chat-template {cfg.tokens.template} (gateway.tokens.template) set without --tokenizer: "
                         "the template only shapes what the tokenizer counts; add --tokenizer, or drop it")
    specs = upstream_specs(cfg)
    for spec in specs:
        _check_upstream_url(spec.url)
    check_routing(cfg.routing, specs)
    _check_ecosystem(cfg)
    if worker_count(cfg) > 1 and cfg.admin_listen == ADMIN_ON_PROXY:
        raise UsageError(f"gateway.workers (--workers) = {cfg.workers!r} needs its own admin_listen (--admin-listen "
                         "auto or HOST:PORT, not proxy): the supervisor serves the merged /metrics and "
                         "/slogate/status there")


def _check_upstream_url(url: str) -> None:
    """HOST:PORT with a port 1-65535, an optional path prefix, nothing the gateway would silently drop:
    credentials, a query, a fragment (`--upstream` options after `#` are already split off)."""
    try:
        parsed = yarl.URL(url)
        ok = bool(parsed.host) and parsed.port is not None and 0 < parsed.port < 65536
    except ValueError:
        parsed, ok = None, False
    if parsed is None or not ok:
        raise _bad("upstreams", _redacted(url), "URLs like http://HOST:PORT (a host, and a port 1-65535)")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise _bad("upstreams", _redacted(url), "a URL without user:password@ (the gateway sends no credentials of "
                   "its own; clients' Authorization headers are relayed to the upstream unchanged)")
    if parsed.raw_query_string or "?" in url:
        raise _bad("upstreams", url, "a URL without a ?query, which would not be sent (a path prefix is kept)")
    if parsed.raw_fragment or "#" in url:
        raise _bad("upstreams", url, "a URL without a #fragment; in [[upstream]] give name, pool, weight, models "
                   "as keys of the table")


def _redacted(url: str) -> str:
    """`url` with any user:password@ replaced by ***@, for error messages."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}{sep}***@{authority.rsplit('@', 1)[1]}{slash}{path}"


def _check_capture_options(trace: TraceConfig) -> None:
    """Capture options given without --trace-dir would do nothing: say so rather than ignore them."""
    if trace.dir is not None:
        return
    default = TraceConfig()
    given = [FLAGS.get(f"trace.{name}", f"trace.{name}") for name in TraceConfig.__struct_fields__
             if name != "dir" and getattr(trace, name) != getattr(default, name)]
    if given:
        raise UsageError(f"{', '.join(given)} set without --trace-dir (gateway.trace.dir): they only shape the "
                         "capture; add --trace-dir DIR, or drop them")


def _check_trace_dir(path: str | None) -> None:
    """A trace directory that is a file, or lies under one, could never be written: every record would be
    dropped. A missing one is fine (the writer creates it with its first segment)."""
    if path is None:
        return
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except NotADirectoryError:
        is_dir = False
    except OSError:  # missing (created later) or unreadable (the writer reports and counts what it loses)
        return
    if not is_dir:
        raise _bad("trace.dir", path, "a directory (created when missing), not a file or a path under a file")


def worker_count(cfg: GatewayConfig) -> int:
    """`workers` as a number: "auto" is the cores this process may run on."""
    n = cfg.workers
    if n == "auto":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
        raise _bad("workers", n)
    return n


def _check_ecosystem(cfg: GatewayConfig) -> None:
    if cfg.log_format not in ("text", "json"):
        raise _bad("log_format", cfg.log_format)
    if not cfg.provider_name or len(cfg.provider_name) > 64:
        raise _bad("provider_name", cfg.provider_name)
    if cfg.access_log is not None and not cfg.access_log:
        raise _bad("access_log", cfg.access_log)


def known_models(cfg: GatewayConfig) -> list[str] | None:
    """The models the upstreams declare (`models=`), or None when any upstream serves any model."""
    specs = upstream_specs(cfg)
    if not specs or any(not s.models for s in specs):
        return None
    return sorted({m for s in specs for m in s.models})


def upstream_specs(cfg: GatewayConfig) -> list[UpstreamSpec]:
    """Every upstream: `--upstream` values (with their #pool=... options) then [[upstream]] tables."""
    return specs_from(cfg.upstreams, cfg.upstream)


def parse_slos(slos: dict[str, str]) -> list[Slo]:
    out = []
    for name, spec in slos.items():
        try:
            out.append(parse_slo(f"{name}:{spec}") if ":" not in spec.split("=", 1)[0] else parse_slo(spec))
        except SloError as exc:
            raise UsageError(f"gateway.slos.{name} (--slo): {exc}") from None
    return out


def trusted_networks(cidrs: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            raise _bad("trust_header_from", cidr, 'CIDR networks such as "10.0.0.0/8" or "::1/128"') from None
    return out


def is_trusted(remote: str | None, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Whether a client's `x-slogate-*` headers count: its address is in `networks` (an unknown one,
    a Unix socket or an address the proxy did not pass on, never)."""
    try:
        addr = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    return any(addr in net for net in networks)


ADMIN_ON_PROXY = "proxy"


def admin_address(cfg: GatewayConfig) -> tuple[str, int] | None:
    """Where the admin endpoints listen: (host, port), or None for "proxy" (on `listen`).
    "auto" is loopback only, on the proxy port + 1, so /metrics is never public unless asked."""
    if cfg.admin_listen == ADMIN_ON_PROXY:
        return None
    if cfg.admin_listen == "auto":
        port = parse_hostport(cfg.listen, key="listen")[1] + 1
        if port > 65535:
            raise _bad("admin_listen", cfg.admin_listen, 'a "HOST:PORT" address: listen is on port 65535')
        return "127.0.0.1", port
    return parse_hostport(cfg.admin_listen, key="admin_listen")


def parse_hostport(text: str, *, key: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(key, text)
    return (host.strip("[]") or "0.0.0.0"), int(port)


def slo_flag(text: str) -> tuple[str, str]:
    """`--slo NAME:ttft=…` (or unnamed `ttft=…` → "default") as a (name, spec) pair."""
    try:
        slo = parse_slo(text)
    except SloError as exc:
        raise UsageError(f"--slo: {exc}") from None
    return slo.name, slo.spec()
