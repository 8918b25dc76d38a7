"""A minimal OpenAI-shaped streaming upstream for client benchmarks: every POST gets the same short
SSE stream (N one-token chunks, a usage chunk, `[DONE]`) in one write, from a raw asyncio Protocol
on uvloop, so the server costs a few tens of µs per request and the client is what is measured.

    python tests/bench/fast_upstream.py --port 8000 [--procs 2] [--tokens 4]

`--procs N` runs N processes on one port (SO_REUSEPORT). Never models an engine: no timing at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import sys

HEAD_END = b"\r\n\r\n"


def response(tokens: int) -> bytes:
    """The whole HTTP/1.1 response: chunked SSE, one chunk per event."""
    events = []
    for i in range(tokens):
        choice = {"index": 0, "text": f" t{i}", "finish_reason": "length" if i == tokens - 1 else None}
        events.append({"id": "cmpl-bench", "object": "text_completion", "model": "bench", "choices": [choice]})
    events.append({"id": "cmpl-bench", "object": "text_completion", "model": "bench", "choices": [],
                   "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}})
    body = b"".join(f"data: {json.dumps(e, separators=(',', ':'))}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    return head + chunked


_MODELS_BODY = b'{"object":"list","data":[{"id":"bench","object":"model"}]}'
MODELS = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_MODELS_BODY), _MODELS_BODY)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


class Upstream(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out = []
        while True:
            end = buf.find(HEAD_END)
            if end < 0:
                break
            head = buf[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"content-length:")
            if at >= 0:
                eol = lower.find(b"\r\n", at)
                length = int(lower[at + 15:eol if eol >= 0 else len(lower)])
            total = end + 4 + length
            if len(buf) < total:
                break
            if head.startswith(b"POST"):
                out.append(self.reply)
            elif b" /v1/models" in head[:40]:
                out.append(MODELS)
            else:
                out.append(NOT_FOUND)
            buf = buf[total:]
        self.buf = buf
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


def serve(port: int, tokens: int) -> None:
    import uvloop

    reply = response(tokens)

    async def main() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.get_running_loop().create_server(lambda: Upstream(reply), sock=sock, backlog=4096)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    uvloop.run(main())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--tokens", type=int, default=4)
    ns = p.parse_args()
    if ns.procs <= 1:
        serve(ns.port, ns.tokens)
        return 0
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=serve, args=(ns.port, ns.tokens), daemon=True) for _ in range(ns.procs)]
    for proc in procs:
        proc.start()
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(x.pid, signal.SIGTERM) for x in procs if x.pid])
    for proc in procs:
        proc.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
