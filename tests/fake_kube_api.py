"""A fake Kubernetes API server for the EndpointSlice watch of `slogate epp` (tests/gateway/test_epp_kube.py).

A fake because no real kube-apiserver can run here (it is on neither PyPI nor Debian, and there is
no network). It speaks the wire protocol the official client uses, for one resource only:
`GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=...` answers an
EndpointSliceList with metadata.resourceVersion; with `watch=true&resourceVersion=RV` it streams
newline-delimited watch events after RV (ADDED/MODIFIED/DELETED/BOOKMARK), or an ERROR event with
code 410 (a Status, as the real server sends) when RV is older than its history. aiohttp, in a
thread of the test process; the test drives it with `put`, `delete`, `expire` and `break_watches`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

PREFIX = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
SERVICE_LABEL = "kubernetes.io/service-name"


def endpoint_slice(name: str, service: str, addresses: list[tuple[str, bool | None]], port: int,
                   port_name: str = "http", address_type: str = "IPv4",
                   labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it (ready None: the field is absent;
    `labels`: the Service's, which the controller copies onto its slices)."""
    endpoints = []
    for i, (addr, ready) in enumerate(addresses):
        conditions = {} if ready is None else {"ready": ready, "serving": ready, "terminating": False}
        endpoints.append({"addresses": [addr], "conditions": conditions, "nodeName": "node-1",
                          "targetRef": {"kind": "Pod", "namespace": "llm", "name": f"{service}-{i}"}})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "llm", "generateName": f"{service}-",
                     "labels": {**(labels or {}), SERVICE_LABEL: service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP", "appProtocol": "http"}],
    }


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


class FakeKubeApi:
    def __init__(self, namespace: str, token: str) -> None:
        self.namespace = namespace
        self.token = token
        self.rv = 100
        self.slices: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (resourceVersion, type, object)
        self.oldest = self.rv  # a watch from before this resourceVersion gets 410 Gone
        self.requests: list[tuple[str, str | None]] = []  # ("list" | "watch", resourceVersion asked)
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Condition | None = None
        self._watches: dict[web.StreamResponse, web.Request] = {}
        self._gone: set[web.StreamResponse] = set()  # watches told to end with 410

    # ------------------------------------------------------------------ driven by the test (any thread)
    def put(self, obj: dict[str, Any], *, notify: bool = True) -> None:
        """Create or replace a slice. notify=False: the change is made but its event is lost from the
        history (as after an etcd compaction): only a re-list shows it."""
        self._call(self._put, copy.deepcopy(obj), notify)

    def delete(self, name: str, *, notify: bool = True) -> None:
        self._call(self._delete, name, notify)

    def bookmark(self) -> None:
        self._call(self._event, "BOOKMARK", None)

    def expire(self) -> None:
        """Compact the history: every open watch ends with an ERROR 410, older resourceVersions are gone."""
        self._call(self._expire)

    def break_watches(self) -> None:
        """Cut every open watch connection (no final chunk: the client sees a broken stream)."""
        self._call(self._break)

    def _call(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._run(fn, *args), self._loop).result(5)

    @staticmethod
    async def _run(fn, *args) -> None:  # type: ignore[no-untyped-def]
        await fn(*args)

    # ------------------------------------------------------------------ state (on the server's loop)
    async def _put(self, obj: dict[str, Any], notify: bool) -> None:
        name = obj["metadata"]["name"]
        kind = "MODIFIED" if name in self.slices else "ADDED"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("uid", f"uid-{name}")
        self.slices[name] = obj
        if notify:
            await self._event(kind, obj)

    async def _delete(self, name: str, notify: bool) -> None:
        obj = self.slices.pop(name)
        self.rv += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        if notify:
            await self._event("DELETED", obj)

    async def _event(self, kind: str, obj: dict[str, Any] | None) -> None:
        if obj is None:  # a bookmark: only the current resourceVersion
            obj = {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                   "metadata": {"resourceVersion": str(self.rv)}}
        self.history.append((self.rv, kind, copy.deepcopy(obj)))
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _expire(self) -> None:
        self.oldest = self.rv
        self.history.clear()
        self._gone |= set(self._watches)
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _break(self) -> None:
        for request in list(self._watches.values()):
            transport = request.transport
            if transport is not None:
                transport.abort()

    # ------------------------------------------------------------------ HTTP
    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._status(401, "Unauthorized", "Unauthorized")
        if request.match_info["ns"] != self.namespace:
            return self._status(403, "Forbidden", f'endpointslices.discovery.k8s.io is forbidden: User '
                                f'"system:serviceaccount:{self.namespace}:slogate-epp" cannot list resource '
                                f'"endpointslices" in API group "discovery.k8s.io" in the namespace '
                                f'"{request.match_info["ns"]}"')
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") in ("true", "True", "1"):
            return await self._watch(request, selector)
        self.requests.append(("list", request.query.get("resourceVersion")))
        items = [s for s in self.slices.values() if _matches(s["metadata"]["labels"], selector)]
        body = {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.rv)}, "items": items}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _watch(self, request: web.Request, selector: str) -> web.StreamResponse:
        asked = request.query.get("resourceVersion")
        self.requests.append(("watch", asked))
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        await resp.prepare(request)
        since = int(asked) if asked else self.rv
        if since < self.oldest:
            await self._send_gone(resp, since)
            return resp
        self._watches[resp] = request
        assert self._changed is not None
        try:
            while True:
                for rv, kind, obj in [h for h in self.history if h[0] > since]:
                    since = rv
                    if kind == "BOOKMARK" or _matches(obj["metadata"].get("labels", {}), selector):
                        await resp.write(orjson.dumps({"type": kind, "object": obj}) + b"\n")
                if resp in self._gone:
                    await self._send_gone(resp, since)
                    return resp
                async with self._changed:
                    await self._changed.wait()
        except ConnectionResetError:  # break_watches() cut it
            return resp
        finally:
            self._watches.pop(resp, None)
            self._gone.discard(resp)

    async def _send_gone(self, resp: web.StreamResponse, since: int) -> None:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": f"too old resource version: {since} ({self.oldest})", "reason": "Expired", "code": 410}
        await resp.write(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")
        await resp.write_eof()

    @staticmethod
    def _status(code: int, reason: str, message: str) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": reason, "code": code}
        return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")

    def watch_requests(self) -> list[str | None]:
        return [rv for kind, rv in self.requests if kind == "watch"]

    def list_requests(self) -> int:
        return sum(1 for kind, _ in self.requests if kind == "list")


def kubeconfig(path: Path, server: str, token: str, namespace: str) -> Path:
    """A kubeconfig for `server`, as `kubectl config` writes one (a token user, a context with a namespace)."""
    path.write_bytes(orjson.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "epp", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "epp", "namespace": namespace}}],
    }))
    return path


@contextlib.contextmanager
def fake_kube_api(namespace: str = "llm", token: str = "test-token") -> Iterator[FakeKubeApi]:
    api = FakeKubeApi(namespace, token)
    ready = threading.Event()
    stop: asyncio.Future | None = None

    async def main() -> None:
        nonlocal stop
        api._loop = asyncio.get_running_loop()
        api._changed = asyncio.Condition()
        app = web.Application()
        app.router.add_get(PREFIX, api.handle)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        api.url = f"http://127.0.0.1:{port}"
        stop = api._loop.create_future()
        ready.set()
        await stop
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the fake Kubernetes API did not start"
    try:
        yield api
    finally:
        assert api._loop is not None and stop is not None
        api._loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)
