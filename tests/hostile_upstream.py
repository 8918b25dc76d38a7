"""A raw asyncio HTTP/1.1 server on 127.0.0.1 that answers with framing a strict client must handle or refuse.

The request path (or `?case=NAME` on any path, e.g. a measured endpoint) picks the answer
(`RESPONSES`, `ENDINGS`; `echo` answers with the request head it got); the response body echoes the request's `?id=` so a desynchronised client
shows up as the wrong body. Runs in the test's loop (`serve`) or in a thread
of its own for a subprocess gateway (`in_thread`). Never used outside tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

PIECES = 300  # a long chunked body: many small chunks, written in several reads


def body_for(rid: bytes) -> bytes:
    return b"".join(b"piece %d of %s\n" % (i, rid) for i in range(PIECES))


def _chunked(body: bytes, size: int = 23) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
                    for i in range(0, len(body), size)) + b"0\r\n\r\n"


def sse_events(*texts: bytes) -> bytes:
    return b"".join(b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % t for t in texts)


OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DONE_EVENT = b"data: [DONE]\n\n"
STREAM = sse_events(b"one", b"two") + DONE_EVENT  # a complete stream: output, then [DONE]
AFTER_DONE = sse_events(b"EXTRA") + b": comment\n\n"  # what a broken upstream sends after [DONE]
RESPONSES = {  # path → (head, framed body) built from the echoed id
    b"/v1/cl-te": lambda rid: OK + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body_for(rid)),
    b"/v1/latin": lambda rid: OK + b"X-Latin: caf\xe9 \xc3\xa9 \xff\r\nContent-Length: 2\r\n\r\nok",  # not UTF-8
    b"/v1/ok": lambda rid: OK + b"Content-Length: %d\r\n\r\n%s" % (len(body_for(rid)), body_for(rid)),
    b"/v1/1xx": lambda rid: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                            + OK + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body_for(rid)),
    b"/v1/0x": lambda rid: OK + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    b"/v1/underscore": lambda rid: OK + b"Transfer-Encoding: chunked\r\n\r\n5_0\r\n" + b"a" * 80 + b"\r\n0\r\n\r\n",
    b"/v1/no-crlf": lambda rid: OK + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n",
    b"/v1/gzip": lambda rid: OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"/v1/fold": lambda rid: OK + b"X-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\nok",
    b"/v1/bare-lf": lambda rid: b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    b"/v1/huge-head": lambda rid: OK + b"X-A: " + b"a" * 70_000 + b"\r\nContent-Length: 2\r\n\r\nok",
    # streams that misbehave after `data: [DONE]`: more events, or no clean end of the body
    b"/v1/sse": lambda rid: SSE + _chunked(STREAM, 1000),
    b"/v1/after-done": lambda rid: SSE + _chunked(STREAM + AFTER_DONE, 1000),
    b"/v1/cut-after-done": lambda rid: SSE + _chunked(STREAM, 1000)[: -len(b"0\r\n\r\n")],
    b"/v1/reset-after-done": lambda rid: SSE + _chunked(STREAM, 1000)[: -len(b"0\r\n\r\n")],
    b"/v1/hang-after-done": lambda rid: SSE + _chunked(STREAM, 1000)[: -len(b"0\r\n\r\n")],
    b"/v1/stall": lambda rid: SSE + _chunked(sse_events(b"one"), 1000)[: -len(b"0\r\n\r\n")],  # then silence
}
ENDINGS = {b"/v1/cut-after-done": "close", b"/v1/reset-after-done": "reset", b"/v1/hang-after-done": "hang",
           b"/v1/stall": "hang"}
PROTOCOL_ERRORS = (b"/v1/0x", b"/v1/underscore", b"/v1/no-crlf", b"/v1/gzip", b"/v1/fold", b"/v1/bare-lf",
                   b"/v1/huge-head")


class _Hostile(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, rest = self.buf.split(b"\r\n\r\n", 1)
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(rest) < length:
                return
            self.buf = rest[length:]
            target = head.split(b" ")[1]
            path, _, query = target.partition(b"?")
            params = dict(p.partition(b"=")[::2] for p in query.split(b"&"))
            rid = params.get(b"id") or b"-"
            if b"case" in params:  # a measured endpoint (…/chat/completions?case=after-done) answering a case
                path = b"/v1/" + params[b"case"]
            if path == b"/v1/echo":  # the request head as the upstream got it, as the body
                wire = OK + b"Content-Length: %d\r\n\r\n%s" % (len(head), head)
            else:
                wire = RESPONSES.get(path, RESPONSES[b"/v1/ok"])(rid)
            for i in range(0, len(wire), 1000):  # several reads on the other side
                self.transport.write(wire[i : i + 1000])  # type: ignore[attr-defined]
            ending = ENDINGS.get(path)
            if ending is not None:  # after the body so far has gone out: close, reset or go quiet
                self.buf = b""
                if ending != "hang":
                    asyncio.get_running_loop().call_later(0.05, self._end, ending)
                return

    def _end(self, ending: str) -> None:
        if self.transport.is_closing():  # type: ignore[attr-defined]
            return  # the gateway closed first
        if ending == "reset":
            sock = self.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close → RST
        self.transport.close()


async def serve() -> tuple[asyncio.Server, str]:
    server = await asyncio.get_running_loop().create_server(_Hostile, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@contextlib.contextmanager
def in_thread() -> Iterator[str]:
    """The server on its own loop in a daemon thread; yields its URL and always stops it."""
    loop = asyncio.new_event_loop()
    started: list[tuple[asyncio.Server, str]] = []
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        started.append(loop.run_until_complete(serve()))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield started[0][1]
    finally:
        loop.call_soon_threadsafe(started[0][0].close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
