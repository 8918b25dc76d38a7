"""The floor of a relay written in Python on uvloop, for gateway_overhead.py's `python-pipe` proxy:
each client connection gets its own upstream connection and bytes are copied both ways unchanged (no
HTTP parsing, no measuring). Never a product path: it answers GET /healthz itself and nothing else."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket

import uvloop

HEALTHZ = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


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

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.up: asyncio.Transport | None = None
        self.pending: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
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
        up, _ = await asyncio.get_running_loop().create_connection(lambda: _Upstream(self.transport), self.host,
                                                                   self.port)
        up.writelines(self.pending or [])
        self.up, self.pending = up, None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None:
            self.up.close()


async def _serve(listen: str, upstream: str) -> None:
    host, port = listen.rsplit(":", 1)
    up_host, up_port = upstream.removeprefix("http://").rstrip("/").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(up_host, int(up_port)), host, int(port))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT")
    args = ap.parse_args()
    uvloop.run(_serve(args.listen, args.upstream))


if __name__ == "__main__":
    main()
