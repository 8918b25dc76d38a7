"""Endpoints from Kubernetes: the EndpointSlices of a Service (or of a label selector), watched.

List, then watch from the list's resourceVersion (bookmarks on); a 410 Gone re-lists; a broken or
refused connection reconnects from the last resourceVersion with backoff (0.5 s doubling to 30 s).
An endpoint counts when its `conditions.ready` is true (missing counts as ready, as in Kubernetes),
on the target ports; every slice's addresses merged and deduplicated. The official client blocks:
the watch runs in its own thread and hands each new list to the loop (PoolUpdater.offer_threadsafe);
it never touches the gateway's objects itself.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from slogate.gateway.epp.endpoints import endpoint_url
from slogate.traces.usage import UsageError

log = logging.getLogger("slogate.epp")

SERVICE_LABEL = "kubernetes.io/service-name"  # set by the EndpointSlice controller on every slice it owns
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_S = 300  # server-side timeout of one watch request (then it is renewed from the last resourceVersion)
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
RBAC_HINT = ("grant get/list/watch on endpointslices (discovery.k8s.io) to the EPP's service account "
             "(deploy/kubernetes/epp/gateway-api/epp-rbac.yaml)")


class KubeSource(msgspec.Struct, frozen=True):
    """What to watch, from the CLI flags (validated; no cluster contacted yet)."""

    label_selector: str  # over EndpointSlices: kubernetes.io/service-name=NAME for --kube-service
    target_ports: tuple[str, ...]  # port names or numbers (as text)
    namespace: str | None = None  # None: the service account's, else the kubeconfig context's, else "default"
    kubeconfig: str | None = None  # None: KUBECONFIG, else in-cluster, else ~/.kube/config

    def describe(self, namespace: str) -> str:
        return f"EndpointSlices {self.label_selector!r} in {namespace}"


def kube_source(service: str | None, label_selector: str | None, target_ports: str | None, namespace: str | None,
                kubeconfig: str | None) -> KubeSource:
    if service and label_selector:
        raise UsageError("--kube-service and --kube-label-selector: give one (a service is the selector "
                         f"{SERVICE_LABEL}=NAME)")
    selector = f"{SERVICE_LABEL}={service}" if service else (label_selector or "").strip()
    if not selector:
        raise UsageError("--kube-label-selector: empty; give e.g. app.kubernetes.io/name=vllm")
    ports = tuple(p.strip() for p in (target_ports or "").split(",") if p.strip())
    if not ports:
        raise UsageError("--endpoint-target-ports: the engine port of the EndpointSlices is needed with "
                         "--kube-service / --kube-label-selector; give its name or number, e.g. http or 8000")
    for p in ports:
        if p.isdigit() and not 0 < int(p) < 65536:
            raise UsageError(f"--endpoint-target-ports {p!r}: a port number is 1-65535 (or give the port's name)")
    return KubeSource(selector, ports, namespace or None, kubeconfig or None)


def endpoints_of(slices: Iterable[dict[str, Any]], ports: tuple[str, ...]) -> list[str]:
    """The endpoint URLs of the slices: ready addresses × target ports, deduplicated, sorted."""
    out: set[str] = set()
    for sl in slices:
        if sl.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue  # FQDN slices: Envoy's ORIGINAL_DST cluster needs an IP
        numbers = [p["port"] for p in sl.get("ports") or () if p.get("port") is not None
                   and (p.get("name") in ports or str(p["port"]) in ports)]
        for ep in sl.get("endpoints") or ():
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for addr in ep.get("addresses") or ():
                try:
                    ip = ipaddress.ip_address(addr)
                except ValueError:
                    continue
                host = f"[{ip}]" if ip.version == 6 else str(ip)
                out.update(endpoint_url(f"{host}:{n}") for n in numbers)
    return sorted(out)


def connect(source: KubeSource) -> tuple[Any, str]:
    """(an ApiClient, the namespace to watch); UsageError on a config that cannot be loaded."""
    import yaml  # the client's own kubeconfig parser
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = source.kubeconfig or os.environ.get("KUBECONFIG") or None
    namespace = source.namespace
    conf = client.Configuration()
    try:
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=conf)
            if namespace is None and SA_NAMESPACE.is_file():
                namespace = SA_NAMESPACE.read_text().strip()
        else:
            config.load_kube_config(config_file=path, client_configuration=conf)
            if namespace is None:
                _, active = config.list_kube_config_contexts(config_file=path)
                namespace = (active or {}).get("context", {}).get("namespace")
    except (ConfigException, yaml.YAMLError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        where = path or "~/.kube/config (no --kubeconfig, KUBECONFIG or in-cluster service account)"
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"--kubeconfig {where}: {text}; give a valid kubeconfig, or run in a pod with a "
                         "service account") from None
    conf.retries = 0  # urllib3 retries nothing (and logs nothing): the watch has its own backoff
    return client.ApiClient(conf), namespace or "default"


class SliceWatch:
    """The EndpointSlices of one selector: listed once, then watched in a thread (module docstring)."""

    def __init__(self, source: KubeSource, api: Any, namespace: str) -> None:
        from kubernetes import client

        self.source = source
        self.namespace = namespace
        self.api = api
        self.discovery = client.DiscoveryV1Api(api)
        self.slices: dict[str, dict[str, Any]] = {}
        self.resource_version: str | None = None
        self.current: list[str] = []
        self.deliver: Callable[[list[str]], None] = lambda urls: None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.source.describe(self.namespace)

    def list(self) -> list[str]:
        """List the slices (blocking); the endpoints now. Raises the client's errors."""
        resp = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=self.source.label_selector, _preload_content=False,
            _request_timeout=(10, 30))
        body = msgspec.json.decode(resp.data)
        self.slices = {s["metadata"]["name"]: s for s in body.get("items") or ()}
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion")
        return endpoints_of(self.slices.values(), self.source.target_ports)

    def first_list(self) -> list[str]:
        """The startup list, from the CLI: UsageError (one line, naming the fix) when it fails."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.current = self.list()
            return self.current
        except ApiException as exc:
            hint = RBAC_HINT if exc.status in (401, 403) else "check --pool-namespace and --kube-service"
            raise UsageError(f"cannot list {self.name}: {exc.status} {exc.reason}; {hint}") from None
        except Exception as exc:  # urllib3's connection errors, a body that is no EndpointSliceList
            host = getattr(getattr(self.api, "configuration", None), "host", "?")
            text = " ".join(str(getattr(exc, "reason", None) or exc).split())[:300]
            raise UsageError(f"cannot list {self.name} at {host}: {text}; check --kubeconfig / KUBECONFIG") from None

    # ------------------------------------------------------------------ the watch thread
    def start(self, deliver: Callable[[list[str]], None]) -> None:
        """Watch in a daemon thread; `deliver(urls)` (thread-safe) gets every changed endpoint list."""
        self.deliver = deliver
        self._thread = threading.Thread(target=self._run, name="slogate-kube-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it may sit in a read until its next event or timeout: never joined)."""
        self._stop.set()

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = BACKOFF_MIN_S
        relist = False
        while not self._stop.is_set():
            try:
                if relist:
                    self._changed(self.list())
                    relist = False
                    log.info("%s re-listed: %d endpoints", self.name, len(self.current))
                began = time.monotonic()
                self._watch()
                backoff = BACKOFF_MIN_S  # the server ended the watch cleanly: renew it (not in a hot loop)
                if time.monotonic() - began < 1.0:
                    self._stop.wait(BACKOFF_MIN_S)
                continue
            except ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: list again, then watch from there
                    log.info("%s: watch expired (410 Gone): re-listing", self.name)
                    relist = True
                    continue
                why = f"{exc.status} {exc.reason}" + (f"; {RBAC_HINT}" if exc.status in (401, 403) else "")
            except RuntimeError:  # the loop is closed: the EPP is stopping
                return
            except Exception as exc:  # the connection broke or was refused, a read timed out
                why = " ".join(str(getattr(exc, "reason", None) or exc).split())[:200] or type(exc).__name__
            if self._stop.is_set():
                return
            log.warning("%s: watch failed (%s): reconnecting in %.1fs", self.name, why, backoff)
            self._stop.wait(backoff)
            backoff = min(2 * backoff, BACKOFF_MAX_S)

    def _watch(self) -> None:
        """One watch request until the server ends it (its timeout) or the EPP stops; raises when it breaks."""
        from kubernetes import watch

        w = watch.Watch()
        stream = w.stream(self.discovery.list_namespaced_endpoint_slice, self.namespace,
                          label_selector=self.source.label_selector, resource_version=self.resource_version,
                          allow_watch_bookmarks=True, timeout_seconds=WATCH_S, _request_timeout=(10, WATCH_S + 30))
        for event in stream:
            if self._stop.is_set():
                w.stop()
                return
            kind, obj = event["type"], event["raw_object"]
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = rv
            name = (obj.get("metadata") or {}).get("name")
            if kind in ("ADDED", "MODIFIED") and name:
                self.slices[name] = obj
            elif kind == "DELETED" and name:
                self.slices.pop(name, None)
            else:
                continue  # BOOKMARK: only the resourceVersion moves
            self._changed(endpoints_of(self.slices.values(), self.source.target_ports))

    def _changed(self, urls: list[str]) -> None:
        if urls != self.current:
            self.current = urls
            self.deliver(urls)
