"""The floor of a relay written in Python on uvloop, for gateway_overhead.py's `python-pipe` proxy:
each client connection gets its own upstream connection and bytes are copied both ways unchanged (no
HTTP parsing, no measuring). With `--measure` (`python-pipe-measure`) it also times every response
the way the gateway must at the least: the shared HTTP/1.1 response parser decodes the chunked body
and the shared SSE observer builds each request's record (TTFT, ITL, tokens), which is then dropped
(no routing, request parsing, metrics or trace). Never a product path: it answers GET /healthz itself
and nothing else."""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import socket
from time import perf_counter_ns

import uvloop

from slogate.traces.http1 import ResponseParser
from slogate.traces.observer import StreamObserver

HEALTHZ = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
RECORDS: collections.Counter[str] = collections.Counter()  # --measure: records built, by error class ("ok"), printed at exit


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.client.write(data)


class _MeasuredUpstream(_Upstream):
    """Forwards the bytes unchanged, and observes each response as the gateway does (then drops the record)."""

    def __init__(self, client: asyncio.Transport, owner: _Client) -> None:
        super().__init__(client)
        self.owner = owner
        self.current: tuple[ResponseParser, StreamObserver] | None = None  # the response being read

    def data_received(self, data: bytes) -> None:
        t = perf_counter_ns()
        self.client.write(data)
        if self.current is None:
            self.current = ResponseParser(), StreamObserver(self.owner.t0, stream=True, endpoint="/v1/completions")
        parser, obs = self.current
        body = parser.feed(data)
        if body:
            obs.feed(body, t)
        if parser.done:
            RECORDS[obs.finish(t, status=parser.head.status if parser.head is not None else 0).error or "ok"] += 1
            self.current = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, host: str, port: int, measure: bool) -> None:
        self.host, self.port, self.measure = host, port, measure
        self.up: asyncio.Transport | None = None
        self.pending: list[bytes] | None = None
        self.t0 = 0  # --measure: the last read from the client (a bench request arrives in one read: its t0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.t0 = perf_counter_ns()
        if self.up is not None:
            self.up.write(data)
        elif self.pending is not None:
            self.pending.append(data)
        elif data.startswith(b"GET /healthz "):
            self.transport.write(HEALTHZ)
        else:
            self.pending = [data]
            asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        def upstream() -> _Upstream:
            return _MeasuredUpstream(self.transport, self) if self.measure else _Upstream(self.transport)

        up, _ = await asyncio.get_running_loop().create_connection(upstream, self.host, self.port)
        up.writelines(self.pending or [])
        self.up, self.pending = up, None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None:
            self.up.close()


async def _serve(listen: str, upstream: str, measure: bool) -> None:
    host, port = listen.rsplit(":", 1)
    up_host, up_port = upstream.removeprefix("http://").rstrip("/").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(up_host, int(up_port), measure), host, int(port))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    if measure:
        print(f"python-pipe --measure: records {dict(RECORDS)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT")
    ap.add_argument("--measure", action="store_true", help="also parse and observe every response (records dropped)")
    args = ap.parse_args()
    uvloop.run(_serve(args.listen, args.upstream, args.measure))


if __name__ == "__main__":
    main()
