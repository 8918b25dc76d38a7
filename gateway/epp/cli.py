"""`slogate epp`: slogate as the Endpoint Picker of an Envoy-based gateway (ext_proc over gRPC).

Takes the gateway's own flags (routing, admission, SLOs, trace capture, metrics: the same
GatewayConfig and the same validation) plus the endpoint sources (`--endpoint`, `--endpoints-file`,
or a Kubernetes Service's EndpointSlices); `--listen` is the gRPC address.
Needs `pip install 'slogate[epp]'`. Never imports replay code.
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Any

import msgspec

from slogate.gateway.cli import _run, build_parser, overrides
from slogate.gateway.config import ADMIN_ON_PROXY, build_config, merge, read_toml
from slogate.traces.usage import UsageError

EXAMPLES = """\
examples:
  # three engine replicas, least in-flight tokens; Envoy's ext_proc filter points at :9002
  slogate epp --listen 0.0.0.0:9002 --admin-listen 0.0.0.0:9090 \\
      --endpoint 10.0.0.5:8000 --endpoint 10.0.0.6:8000 --endpoint 10.0.0.7:8000

  # endpoints from a file (one IP:PORT per line), re-read when it changes; capture a trace
  slogate epp --endpoints-file /etc/slogate/endpoints --trace-dir /var/lib/slogate/traces

  # in Kubernetes: the ready pods behind Service "vllm" (its EndpointSlices, watched), port "http";
  # in a pod: its service account (RBAC: deploy/kubernetes/epp/gateway-api/epp-rbac.yaml)
  slogate epp --kube-service vllm --pool-namespace llm --endpoint-target-ports http

  # outside the cluster, through a kubeconfig; slices picked by the Services' own labels
  slogate epp --kubeconfig ~/.kube/config --kube-label-selector app.kubernetes.io/name=vllm \
      --endpoint-target-ports 8000

  # admission: at most 32 requests in flight per endpoint, then queue, then 429 through Envoy
  slogate epp --endpoint 10.0.0.5:8000 --endpoint 10.0.0.6:8000 --max-inflight-requests 32

  curl localhost:9090/metrics          # the gateway's families: TTFT/TPOT/ITL/E2E, tokens, goodput
  curl localhost:9090/slogate/status   # 1 min / 5 min windows, endpoints, routing

Envoy side: deploy/envoy-epp.yaml (ext_proc in FULL_DUPLEX_STREAMED mode, an ORIGINAL_DST cluster
that reads x-gateway-destination-endpoint). failure_mode_allow: false there (the default) makes a
failed EPP fail closed (500 to the client); true lets requests through to the route's default.
"""


def epp_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "slogate epp"
    p.description = ("Endpoint Picker for Envoy (ext_proc gRPC): picks the endpoint of each LLM request with "
                     "slogate's routing, measures its response with the gateway's stream observer, exports the "
                     "gateway's metrics and captures its trace. --listen is the gRPC address (default "
                     "0.0.0.0:9002); --admin-listen serves /metrics, /slogate/status, /healthz, /readyz (default 'auto': "
                     "127.0.0.1 on the gRPC port + 1).")
    p.epilog = EXAMPLES
    p.add_argument("--endpoint", metavar="IP:PORT", action="append", dest="endpoints", default=[],
                   help="an endpoint of the pool (repeat); also an upstream URL with #pool=...,weight=... options")
    p.add_argument("--endpoints-file", metavar="PATH",
                   help="endpoints, one IP:PORT per line ('#' comments); re-read within 1 s of a change")
    k = p.add_argument_group("Kubernetes endpoints (the EndpointSlices of a Service, listed then watched)")
    k.add_argument("--kube-service", metavar="NAME",
                   help="route to the ready endpoints of this Service (its EndpointSlices, label "
                        "kubernetes.io/service-name=NAME), e.g. --kube-service vllm")
    k.add_argument("--kube-label-selector", metavar="SELECTOR",
                   help="instead of --kube-service: EndpointSlices by label selector (slices carry their Service's "
                        "labels, not the pods'), e.g. 'app.kubernetes.io/name=vllm'")
    k.add_argument("--endpoint-target-ports", metavar="PORTS",
                   help="the engine port of the slices, by name or number, comma-separated for several "
                        "(required with the two above), e.g. http or 8000")
    k.add_argument("--pool-namespace", metavar="NS",
                   help="the namespace of the slices (default: the pod's own, else the kubeconfig context's, "
                        "else 'default'), e.g. --pool-namespace llm")
    k.add_argument("--kubeconfig", metavar="PATH",
                   help="a kubeconfig (default: KUBECONFIG, else the in-cluster service account, else "
                        "~/.kube/config), e.g. --kubeconfig ~/.kube/config")
    return p


def kube_of(args: argparse.Namespace) -> Any:
    """The Kubernetes endpoint source of the flags (gateway/epp/kube.py), or None."""
    if not (args.kube_service or args.kube_label_selector is not None):
        for flag in ("endpoint_target_ports", "pool_namespace", "kubeconfig"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} applies to Kubernetes endpoints: add --kube-service "
                                 "NAME (or --kube-label-selector)")
        return None
    if args.endpoints or args.endpoints_file or args.upstreams:
        raise UsageError("--kube-service / --kube-label-selector: the pool comes from Kubernetes; drop "
                         "--endpoint / --endpoints-file / --upstream")
    from slogate.gateway.epp.kube import kube_source

    return kube_source(args.kube_service, args.kube_label_selector, args.endpoint_target_ports,
                       args.pool_namespace, args.kubeconfig)


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        print(f"slogate epp: error: {exc}", file=sys.stderr)
        return 2


def config_of(args: argparse.Namespace) -> Any:
    from slogate.gateway.epp.endpoints import endpoint_url, read_endpoints

    base = read_toml(args.config) if args.config else {}
    flags = overrides(args)
    kube = kube_of(args)
    urls = list(flags.get("upstreams") or []) + [endpoint_url(e) for e in args.endpoints]
    if args.endpoints_file:
        urls += read_endpoints(args.endpoints_file)
    if kube is not None:  # listed at startup (_main): validated over a stand-in, the pool may be empty then
        base = {k: v for k, v in base.items() if k not in ("upstreams", "upstream")}
        urls = ["http://127.0.0.1:1"]
    if not urls and not base.get("upstreams") and not base.get("upstream"):
        raise UsageError("no endpoint: give --endpoint IP:PORT (repeat), --endpoints-file PATH or "
                         "--kube-service NAME")
    flags["upstreams"] = urls or None
    flags["listen"] = args.listen or "0.0.0.0:9002"
    cfg = build_config(merge(base, flags))
    if kube is not None:
        cfg = msgspec.structs.replace(cfg, upstreams=[], upstream=[])
    if cfg.admin_listen == ADMIN_ON_PROXY:
        raise UsageError('--admin-listen "proxy": the EPP\'s --listen is gRPC; give "auto" or HOST:PORT')
    return cfg


def _main(argv: list[str]) -> int:
    args = epp_parser().parse_args(argv)
    cfg = config_of(args)
    if args.workers not in (None, "1"):
        raise UsageError("--workers: the EPP runs one process; run more EPP replicas instead (README)")
    try:
        from slogate.gateway.epp.server import serve

        watch = _kube_watch(kube_of(args))
    except ModuleNotFoundError as exc:
        raise UsageError(f"slogate epp needs the epp extra ({exc.name} missing): pip install 'slogate[epp]'") from None
    from slogate.gateway.logs import setup_logging

    setup_logging(args.log_level, fmt=cfg.log_format)
    if watch is not None:  # the pool as listed now; the watch (in serve) follows it from there
        cfg = msgspec.structs.replace(cfg, upstreams=watch.first_list())
    try:
        _run(serve(cfg, endpoints_file=args.endpoints_file, kube=watch))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise UsageError(f"cannot listen: {exc}; choose another --listen / --admin-listen address") from None
        raise
    return 0


def _kube_watch(source: Any) -> Any:
    if source is None:
        return None
    from slogate.gateway.epp.kube import SliceWatch, connect

    api, namespace = connect(source)
    return SliceWatch(source, api, namespace)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
