"""One HTTP request's side of the engine: receives token events and writes pre-encoded SSE bytes.

`Sink.on_token` runs inside the engine's step-end pass for every running stream, so it writes
straight to the transport (HTTP chunked framing done here), measures the emission lag, and never
awaits. Mid-stream faults (error event, TCP reset, stall) are carried out here.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from slogate.replay.sim import protocol
from slogate.replay.sim.faults import RequestFault
from slogate.replay.sim.prom import ServerStats
from slogate.replay.sim.scheduler import SimReq
from slogate.replay.sim.tokenizer import SPACE_WORD_BYTES, WORD_BYTES, WORDS, output_text

_NW = len(WORDS)
_LINGER0 = struct.pack("ii", 1, 0)


def frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class Sink:
    """Token events of one request → bytes on its connection (stream) or one body (non-stream)."""

    __slots__ = ("abort", "arrival", "cached", "chunked", "codec", "conn", "done", "fault", "first", "held",
                 "include_usage", "kind", "last", "max_tokens", "n", "prompt_tokens", "reason", "req", "sent", "stats",
                 "transport", "word0")

    def __init__(self, *, kind: str, codec: protocol.ChunkCodec, n: int, reason: str, prompt_tokens: int,
                 stats: ServerStats, fault: RequestFault | None, include_usage: bool, word0: int,
                 abort: Callable[[SimReq], None], report_cached: bool, max_tokens: int = 0) -> None:
        self.kind = kind
        self.codec = codec
        self.n = n
        self.max_tokens = max_tokens  # the request's, or what is left of the context (vLLM's default)
        self.reason = reason
        self.prompt_tokens = prompt_tokens
        self.stats = stats
        self.fault = fault
        self.include_usage = include_usage
        self.word0 = word0
        self.abort = abort
        self.cached: int | None = 0 if report_cached else None
        self.transport: Any = None  # set for streams once headers are sent
        self.conn: Any = None  # the request's connection, streaming or not (a reset fault aborts it)
        self.chunked = True  # HTTP/1.1 chunked framing; False for HTTP/1.0 (the body ends when the connection closes)
        self.req: SimReq | None = None
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent = 0
        self.arrival = 0.0
        self.first = 0.0
        self.last = 0.0
        self.held: list[bytes] | None = None

    # -- engine callbacks (hot path) ---------------------------------------------------------

    def on_token(self, t: float) -> None:
        k = self.sent
        self.sent = k + 1
        st = self.stats
        st.generation_tokens += 1
        if k == 0:
            self.first = t
            st.ttft.observe(t - self.arrival)
            st.prompt_tokens += self.prompt_tokens
        else:
            st.itl.observe(t - self.last)
        self.last = t
        if self.transport is None:
            if self.fault is not None:
                self._body_fault(k)
            return
        if self.fault is not None and self._fault(k, t):
            return
        codec = self.codec
        w = (self.word0 + k) % _NW
        data = codec.role + codec.head + WORD_BYTES[w] if k == 0 else codec.head + SPACE_WORD_BYTES[w]
        if k + 1 < self.n:
            data += codec.tail
        else:
            data += codec.last_tail(self.reason)
            if self.include_usage:
                data += codec.usage_chunk(self.prompt_tokens, self.n, self._cached())
            data += protocol.DONE
        if self.held is not None:
            self.held.append(data)
            return
        tr = self.transport
        if tr.is_closing():
            self._gone()
            return
        tr.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        lag = time.perf_counter() - t
        if lag < 0.0:
            lag = -lag
        st.emit_lag.observe(lag)
        if lag > st.emit_lag_max:
            st.emit_lag_max = lag

    def on_finish(self, req: SimReq, t: float) -> None:
        st = self.stats
        if self.sent < self.n:  # failed by the engine before finishing (did not fit)
            self.finish_error("The request does not fit in the KV cache.", "BadRequestError", 400)
            return
        st.e2e.observe(t - self.arrival)
        if req.first_sched is not None:
            st.queue.observe(req.first_sched - self.arrival)
            st.prefill.observe(self.first - req.first_sched)
            st.inference.observe(self.last - req.first_sched)
        st.decode.observe(self.last - self.first)
        st.request_prompt.observe(self.prompt_tokens)
        st.request_generation.observe(self.n)
        st.params_max_tokens.observe(self.max_tokens)
        st.params_n.observe(1)
        st.success[self.reason] += 1
        if self.done.done():
            return
        if self.transport is None:
            use = protocol.usage(self.prompt_tokens, self.n, self._cached())
            text = output_text(self.word0, self.n)
            body = protocol.completion_body(self.kind, self.codec.id, self.codec.created, self.codec.model, text,
                                            self.reason, use)
            f = self.fault
            if f is not None and f.stall_after is not None and f.stall_after < self.n and f.stall_ms > 0:
                asyncio.get_running_loop().call_later(f.stall_ms / 1e3, self._set_body, body)  # a stalled body
            else:
                self.done.set_result(body)
        elif self.held is None:
            self.done.set_result("ok")

    # -- faults and failures -----------------------------------------------------------------

    def _cached(self) -> int | None:
        if self.cached is None or self.req is None:
            return None
        return self.req.cached_tokens or 0

    def _set_body(self, body: bytes) -> None:
        if not self.done.done():
            self.done.set_result(body)

    def _body_fault(self, k: int) -> None:
        """A non-streaming request's mid-generation faults: an error body (vLLM's 500 when the engine fails
        a request), or a TCP reset. A stall delays the body (on_finish)."""
        f = self.fault
        assert f is not None
        if f.error_after == k:
            self.finish_error(f"Simulated engine error after {k} tokens.", "InternalServerError", f.error_status)
        elif f.reset_after == k:
            self.reset()

    def _fault(self, k: int, t: float) -> bool:
        f = self.fault
        assert f is not None
        if f.error_after == k:
            self.finish_error(f"Simulated engine error after {k} tokens.", "InternalServerError", f.error_status)
            return True
        if f.reset_after == k:
            self.reset()
            return True
        if f.stall_after == k and f.stall_ms > 0 and self.held is None:
            self.held = []
            loop = asyncio.get_running_loop()
            loop.call_later(max(0.0, t + f.stall_ms / 1e3 - time.perf_counter()), self._flush)
        return False

    def _flush(self) -> None:
        if self.held is None:  # already flushed by an error or a reset
            return
        held, self.held = self.held, None
        if self.fault is not None:
            self.fault.stall_after = None  # one stall per request; other faults still apply
        tr = self.transport
        if tr is None or tr.is_closing():
            self._gone()
            return
        if held:
            tr.write(self._framed(b"".join(held)))
        if self.sent >= self.n and not self.done.done():
            self.done.set_result("ok")

    def _framed(self, data: bytes) -> bytes:
        return frame(data) if self.chunked else data

    def _stop_engine_side(self, reason: str = "abort") -> None:
        """Drop the request in the engine (freeing its blocks) and count how it ended."""
        if self.req is not None and not self.req.done:
            self.abort(self.req)
            self.stats.success[reason] += 1

    def _gone(self) -> None:
        """The client closed the connection: free the request's blocks."""
        self._stop_engine_side()
        if not self.done.done():
            self.done.set_result("gone")

    def finish_error(self, message: str, err_type: str = "InternalServerError", code: int = 500) -> None:
        """Fail the request: an error event then [DONE] (stream) or an error body."""
        self._stop_engine_side("error")
        if self.done.done():
            return
        if self.transport is None:
            self.done.set_result((code, protocol.error_body(message, err_type, code)))
            return
        held, self.held = self.held or [], None  # tokens held by a stall go first
        if not self.transport.is_closing():
            self.transport.write(self._framed(b"".join(held) + protocol.error_event(message, err_type, code)
                                              + protocol.DONE))
        self.done.set_result("error")

    def reset(self) -> None:
        """Abort the TCP connection with RST (SO_LINGER 0), mid-stream."""
        self._stop_engine_side()
        self.held = None
        tr = self.conn
        if tr is not None:
            sock = tr.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
            tr.abort()
        if not self.done.done():
            self.done.set_result("reset")
