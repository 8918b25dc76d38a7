"""`slogate gateway`: parse flags (+ optional TOML config) into a GatewayConfig and run the server on uvloop.

Flags override the config file; every mistake a user can make is a one-line `UsageError` (exit 2).
Never imports replay code or anything heavy (no rich, no matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import math
import socket
import sys
from typing import Any

from slogate.gateway.config import build_config, merge, read_toml, slo_flag, worker_count
from slogate.gateway.routing.policies import POLICIES
from slogate.traces.slo import SloError, parse_duration
from slogate.traces.usage import UsageError

EXAMPLES = """\
examples:
  # one upstream; metrics and status on 127.0.0.1:8081 (the admin listener: the proxy port + 1)
  slogate gateway --listen 0.0.0.0:8080 --upstream http://127.0.0.1:8000

  # SLOs for goodput, a separate admin port, capture 10% of requests to a trace
  slogate gateway --upstream http://127.0.0.1:8000 --slo interactive:ttft=0.5,tpot=50ms \\
      --slo batch:e2e=60 --admin-listen 127.0.0.1:9090 --trace-dir /var/lib/slogate/traces \\
      --trace-sample 0.1 --trace-salt-file /etc/slogate/salt

  # four replicas balanced by in-flight tokens; long requests to their own pool
  slogate gateway --upstream http://gpu1:8000 --upstream http://gpu2:8000 \\
      --upstream 'http://gpu3:8000#pool=long' --upstream 'http://gpu4:8000#pool=long,weight=2' \\
      --pool 'long: prompt_tokens >= 4096 or max_tokens >= 2048' --max-inflight-requests 64

  # everything from a file, one flag overridden
  slogate gateway --config slogate.toml --idle-timeout 30

  curl localhost:8081/metrics          # Prometheus text, on the admin listener (--admin-listen)
  curl localhost:8081/slogate/status   # 1 min / 5 min windows: rates, goodput, percentiles
  curl localhost:8080/readyz           # probes also answer on the proxy port
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _duration(text: str) -> float:
    """A duration flag's seconds; non-finite values (`1e400` overflows to inf) are refused like `inf` itself."""
    try:
        value = parse_duration(text)
    except SloError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: expected a finite number of seconds, e.g. 30 or 500ms")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="slogate gateway",
        description="Transparent streaming sidecar for OpenAI-compatible LLM servers: relays every request, "
        "measures TTFT/TPOT/tokens, exports goodput metrics and captures anonymized traces.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="TOML file with a [gateway] table (flags override it)")
    p.add_argument("--listen", metavar="HOST:PORT", help="proxy address (default 0.0.0.0:8080)")
    p.add_argument("--upstream", metavar="URL", action="append", dest="upstreams",
                   help="upstream server base URL, optionally URL#pool=NAME,weight=N,name=LABEL,models=a|b; "
                   "repeat for several (balanced by --policy)")
    p.add_argument("--admin-listen", metavar="HOST:PORT|auto|proxy",
                   help="/metrics and /slogate/status (and /healthz, /readyz) here; default auto: 127.0.0.1 on the "
                   "--listen port + 1, never public; 'proxy': on the --listen port beside the proxied paths "
                   "(exposes them to every client). /healthz and /readyz always answer on --listen too")
    p.add_argument("--slo", metavar="NAME:SPEC", action="append", dest="slos",
                   help="SLO for goodput, e.g. interactive:ttft=0.5,tpot=50ms,e2e=30 (repeatable)")
    p.add_argument("--no-inject-usage", dest="inject_usage", action="store_false", default=None,
                   help="do not add stream_options.include_usage to streams that lack it")
    p.add_argument("--max-body-bytes", type=int, metavar="N", help="larger request bodies get 413 (default 32 MiB)")
    p.add_argument("--max-inflight-body-bytes", type=int, metavar="N",
                   help="request-body bytes buffered at once over all clients; a body beyond it gets 503 "
                   "(default 256 MiB; per worker with --workers)")
    p.add_argument("--max-connections", type=int, dest="max_connections_per_upstream", metavar="N",
                   help="connection pool size per upstream (default 1024)")
    p.add_argument("--trust-header-from", metavar="CIDR", action="append",
                   help="clients whose x-slogate-* headers (priority, simulator faults) are honoured and "
                   "forwarded; repeatable; 'none' for no client (default loopback only)")
    p.add_argument("--unready-after-errors", type=_duration, metavar="SECONDS",
                   help="/readyz answers 503 once every request failed upstream-side this long (default 30)")
    p.add_argument("--workers", metavar="N",
                   help='worker processes accepting on --listen (SO_REUSEPORT) under one supervisor; "auto": '
                   "one per core; the supervisor serves the merged admin endpoints (not with --admin-listen proxy) (default 1)")
    p.add_argument("--shutdown-grace", type=_duration, metavar="SECONDS",
                   help="on SIGTERM, wait this long for in-flight streams (default 30)")
    t = p.add_argument_group("timeouts (seconds, or with a unit: 500ms, 2s)")
    t.add_argument("--connect-timeout", type=_duration, metavar="S", help="TCP connect to the upstream (default 5)")
    t.add_argument("--ttfb-timeout", type=_duration, metavar="S", help="until the first response byte (default 300)")
    t.add_argument("--idle-timeout", type=_duration, metavar="S", help="gap between chunks (default 60)")
    t.add_argument("--total-timeout", type=_duration, metavar="S", help="whole request (default 3600)")
    k = p.add_argument_group("client connections (slow or idle clients are closed and counted)")
    k.add_argument("--client-header-timeout", type=_duration, metavar="S",
                   help="a request header must arrive within S of its first byte (default 10)")
    k.add_argument("--client-body-timeout", type=_duration, metavar="S",
                   help="a request body must arrive within S plus 1 s per --client-body-min-rate bytes (default 30)")
    k.add_argument("--client-body-min-rate", type=float, metavar="BYTES_PER_S",
                   help="slowest body upload kept open indefinitely (default 16384)")
    k.add_argument("--client-keepalive-timeout", type=_duration, metavar="S",
                   help="close a connection idle this long between requests (default 15)")
    k.add_argument("--max-client-connections", type=int, metavar="N",
                   help="open client connections; beyond it the oldest idle one is closed, else 503 "
                   "(default: the open-files limit less a reserve)")
    c = p.add_argument_group("trace capture")
    c.add_argument("--trace-dir", metavar="DIR", help="write anonymized trace segments here")
    c.add_argument("--trace-sample", type=float, metavar="FRACTION", help="fraction of requests captured, whole sessions kept or dropped (default 1)")
    c.add_argument("--trace-seed", type=int, metavar="N", help="seed of the sampling RNG")
    c.add_argument("--trace-salt-file", metavar="FILE",
                   help="secret salt for prefix hashes (created 0600 when missing; SLOGATE_TRACE_SALT wins)")
    c.add_argument("--trace-flush-interval", type=_duration, metavar="S", help="flush a zstd frame this often (default 1)")
    c.add_argument("--trace-rotate-bytes", type=int, metavar="N", help="rotate segments at this size (default 256 MiB)")
    c.add_argument("--trace-rotate-seconds", type=_duration, metavar="S", help="rotate segments at this age (default 3600)")
    c.add_argument("--trace-queue-size", type=int, metavar="N", help="writer queue; a full queue drops records")
    c.add_argument("--trace-chunk-times", action="store_true", default=None,
                   help="also store every chunk's time offset per request")
    c.add_argument("--session-header", metavar="NAME",
                   help="request header that names the session (stored only as a keyed hash)")
    c.add_argument("--session-from", metavar="LIST",
                   help="session sources by precedence: header, user (the OpenAI user field), prefix (a prompt "
                   "that continues an earlier prompt), or off (default header,user,prefix)")
    c.add_argument("--session-window", type=_duration, metavar="S",
                   help="longest pause between a session's answer and its next turn (default 600)")
    r = p.add_argument_group("routing (several upstreams)")
    r.add_argument("--policy", choices=POLICIES, help="load-balancing policy (default least-tokens)")
    r.add_argument("--pool", metavar="RULE", action="append", dest="pools",
                   help="pool rule, e.g. 'long: prompt_tokens >= 4096 or max_tokens >= 2048' (repeatable; "
                   "first match wins, else pool default)")
    r.add_argument("--scrape-upstream-metrics", action="store_true", default=None,
                   help="scrape each upstream's /metrics (queue, KV usage) to correct least-tokens")
    r.add_argument("--max-inflight-requests", type=int, metavar="N", help="admission limit per upstream")
    r.add_argument("--max-inflight-tokens", type=int, metavar="N", help="admission limit per upstream (tokens)")
    r.add_argument("--queue-size", type=int, metavar="N", help="requests waiting when a pool is full (default 1024)")
    r.add_argument("--queue-timeout", type=_duration, metavar="S", help="wait at most this long, then 429 (default 30)")
    r.add_argument("--health-interval", type=_duration, metavar="S",
                   help="active /health checks every S seconds (default 5 with several upstreams; 0: off)")
    r.add_argument("--health-path", metavar="PATH", help="health check path (default /health)")
    r.add_argument("--retries", type=int, metavar="N",
                   help="retry on another upstream before any byte reached the client (default 2)")
    k = p.add_argument_group("token counting (upstreams that send no usage)")
    k.add_argument("--tokenizer", metavar="FILE|URL", help="count input tokens exactly: a tokenizer.json (pip install "
                   "'slogate[tokenizer]') or the server's tokenize URL (http://HOST:PORT/tokenize, …/extras/tokenize); "
                   "off the hot path. Without it, prompts are estimated at bytes/4 and marked estimated")
    k.add_argument("--chat-template", choices=["none", "gemma", "chatml", "llama3"], help="chat template applied "
                   "before counting with a file or /extras/tokenize (default none: content only, stays estimated)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _ecosystem_flags(p)
    return p


def _ecosystem_flags(p: argparse.ArgumentParser) -> None:
    """Semconv metric labels, logs and OTLP export (issue 17)."""
    e = p.add_argument_group("metrics labels, logs, OpenTelemetry")
    e.add_argument("--provider-name", metavar="NAME", help='gen_ai_provider_name label (default "openai")')
    e.add_argument("--legacy-model-label", action="store_true", default=None,
                   help="also emit the old `model` label beside gen_ai_request_model (deprecated; one release)")
    e.add_argument("--log-format", choices=["text", "json"], help="lifecycle log lines as text (default) or JSON")
    e.add_argument("--access-log", metavar="PATH|-",
                   help="one JSON line per request (no content, keys or addresses); reopened on SIGHUP")
    e.add_argument("--otel", action="store_true", default=None,
                   help="export one span per request (and the metrics) over OTLP/HTTP; needs slogate[otel]; "
                   "configure with OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "listen": args.listen,
        "admin_listen": args.admin_listen,
        "upstreams": args.upstreams,
        "inject_usage": args.inject_usage,
        "max_body_bytes": args.max_body_bytes,
        "max_inflight_body_bytes": args.max_inflight_body_bytes,
        "max_connections_per_upstream": args.max_connections_per_upstream,
        "shutdown_grace": args.shutdown_grace,
        "workers": None if args.workers is None else (int(args.workers) if args.workers.isdigit() else args.workers),
        "unready_after_errors": args.unready_after_errors,
        "timeouts.connect": args.connect_timeout,
        "timeouts.ttfb": args.ttfb_timeout,
        "timeouts.idle": args.idle_timeout,
        "timeouts.total": args.total_timeout,
        "client.header_timeout": args.client_header_timeout,
        "client.body_timeout": args.client_body_timeout,
        "client.body_min_rate": args.client_body_min_rate,
        "client.keepalive_timeout": args.client_keepalive_timeout,
        "client.max_connections": args.max_client_connections,
        "trace.dir": args.trace_dir,
        "trace.sample": args.trace_sample,
        "trace.seed": args.trace_seed,
        "trace.salt_file": args.trace_salt_file,
        "trace.flush_interval": args.trace_flush_interval,
        "trace.rotate_bytes": args.trace_rotate_bytes,
        "trace.rotate_seconds": args.trace_rotate_seconds,
        "trace.queue_size": args.trace_queue_size,
        "trace.chunk_times": args.trace_chunk_times,
        "trace.session_header": args.session_header,
        "trace.session_from": args.session_from,
        "trace.session_window": args.session_window,
        "routing.policy": args.policy,
        "routing.pools": args.pools,
        "routing.scrape_upstream_metrics": args.scrape_upstream_metrics,
        "routing.max_inflight_requests": args.max_inflight_requests,
        "routing.max_inflight_tokens": args.max_inflight_tokens,
        "routing.queue_size": args.queue_size,
        "routing.queue_timeout": args.queue_timeout,
        "routing.health.interval": args.health_interval,
        "routing.health.path": args.health_path,
        "routing.retries": args.retries,
        "tokens.tokenizer": args.tokenizer,
        "tokens.template": args.chat_template,
    }
    if args.trust_header_from:
        if "none" in args.trust_header_from and len(args.trust_header_from) > 1:
            raise UsageError("--trust-header-from none trusts no client: it cannot be combined with networks "
                             f"({', '.join(c for c in args.trust_header_from if c != 'none')}); give one or the other")
        out["trust_header_from"] = [c for c in args.trust_header_from if c != "none"]
    out |= {  # ---- ecosystem (issue 17)
        "provider_name": args.provider_name,
        "legacy_model_label": args.legacy_model_label,
        "log_format": args.log_format,
        "access_log": args.access_log,
        "otel": args.otel,
    }
    if args.slos:
        pairs = [slo_flag(s) for s in args.slos]
        names = [name for name, _ in pairs]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise UsageError(f"--slo: two SLOs are named {twice!r} (the last would replace the first); give each "
                             "its own NAME:, e.g. --slo interactive:ttft=0.5 --slo batch:e2e=30")
        out["slos"] = dict(pairs)
    return out


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except UsageError as exc:  # also when the dispatcher runs as __main__ (its UsageError is another class)
        print(f"slogate gateway: error: {exc}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    base = read_toml(args.config) if args.config else {}
    cfg = build_config(merge(base, overrides(args)))

    from slogate.gateway.logs import setup_logging
    from slogate.gateway.server import serve

    setup_logging(args.log_level, fmt=cfg.log_format)
    try:
        if worker_count(cfg) > 1:
            from slogate.gateway.workers import Supervisor

            return _run(Supervisor(cfg, worker_count(cfg), args.log_level).run())
        _run(serve(cfg))
    except OSError as exc:
        # socket.gaierror: a host name that does not resolve (its errno is the resolver's, e.g. EAI_NONAME)
        if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            where = cfg.listen + (f" (admin {cfg.admin_listen})" if cfg.admin_listen else "")
            raise UsageError(f"cannot listen on {where}: {exc.strerror or exc}; choose another --listen / "
                             "--admin-listen address") from None
        raise
    return 0


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
