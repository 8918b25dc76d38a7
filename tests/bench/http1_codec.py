"""HTTP/1.1 response codec benchmark: the hand-written `traces.http1` parser vs httptools (llhttp) and h11.

Run: `.venv/bin/python tests/bench/http1_codec.py [--streams 300] [--repeat 5]`. The gateway's workload:
SSE token streams (32 and 1,000 tokens) in chunked framing, one chunk per read as a streaming upstream
sends them, plus the same streams with 8 chunks coalesced per read. Reports CPU ns per chunk (head
parsing and the sink calls included, amortised over the stream), prints a table and writes
tests/bench/results/http1_codec.json. A benchmark script, never a timed test.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

import h11  # noqa: E402
import httptools  # noqa: E402
from bench_output import aligned_rows, save_json  # noqa: E402

from slogate.traces.http1 import ResponseParser  # noqa: E402

HEAD = (b"HTTP/1.1 200 OK\r\ndate: Sat, 31 Jan 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")


def stream_reads(tokens: int, per_read: int) -> list[bytes]:
    """The reads of one streamed completion: the head, one SSE event per chunk, `per_read` chunks per read."""
    events = [b'data: {"id":"cmpl-8f3a","object":"text_completion","created":1769860800,"model":"llama-3-8b",'
              b'"choices":[{"index":0,"text":" tok%d","logprobs":null,"finish_reason":null}]}\n\n' % i
              for i in range(tokens)] + [b"data: [DONE]\n\n"]
    chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
    reads = [HEAD]
    for i in range(0, len(chunks), per_read):
        reads.append(b"".join(chunks[i : i + per_read]))
    return reads


def run_ours(reads: list[bytes], sink: Callable[[bytes, int], None]) -> None:
    p = ResponseParser()
    for data in reads:
        piece = p.feed(data)
        if piece:
            sink(piece, 0)
    assert p.done and p.head is not None


class _HtProto:
    """What an httptools-based UpstreamConn would keep: the head's fields, the sink, the end."""

    __slots__ = ("done", "headers", "sink")

    def __init__(self, sink: Callable[[bytes, int], None]) -> None:
        self.sink, self.headers, self.done = sink, [], False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.sink(body, 0)

    def on_message_complete(self) -> None:
        self.done = True


def run_httptools(reads: list[bytes], sink: Callable[[bytes, int], None]) -> None:
    proto = _HtProto(sink)
    parser = httptools.HttpResponseParser(proto)
    for data in reads:
        parser.feed_data(data)
    assert proto.done and parser.get_status_code() == 200


def run_h11(reads: list[bytes], sink: Callable[[bytes, int], None]) -> None:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    done = False
    for data in reads:
        conn.receive_data(data)
        while (e := conn.next_event()) is not h11.NEED_DATA:
            if type(e) is h11.Data:
                sink(e.data, 0)
            elif type(e) is h11.EndOfMessage:
                done = True
                break
    assert done


PARSERS = {"traces.http1 (hand-written)": run_ours, "httptools (llhttp)": run_httptools, "h11": run_h11}


def measure(fn: Callable, reads: list[bytes], events: int, streams: int, repeat: int) -> tuple[float, int]:
    """Best CPU ns per SSE event (chunk) over `repeat` runs of `streams` responses; and sink calls per stream."""
    pieces: list[bytes] = []
    sink = lambda piece, t: pieces.append(piece)  # noqa: E731  # what the relay's sink costs at least
    fn(reads, sink)
    per_stream = len(pieces)
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        pieces.clear()
        t0 = time.process_time_ns()
        for _ in range(streams):
            fn(reads, sink)
            pieces.clear()
        best = min(best, (time.process_time_ns() - t0) / (streams * events))
    return best, per_stream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=300, help="responses per run for 32-token streams (÷10 for 1,000)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = [["workload", *(f"{name} ns/chunk (sink calls)" for name in PARSERS), "httptools / hand-written"]]
    results = []
    for tokens in (32, 1000):
        for per_read in (1, 8):
            reads = stream_reads(tokens, per_read)
            streams = args.streams if tokens == 32 else max(1, args.streams // 10)
            ns, calls = {}, {}
            for name, fn in PARSERS.items():
                ns[name], calls[name] = measure(fn, reads, tokens + 1, streams, args.repeat)
            ratio = ns["httptools (llhttp)"] / ns["traces.http1 (hand-written)"]
            label = f"{tokens} tokens, {per_read} chunk{'s' if per_read > 1 else ''}/read"
            rows.append([label, *(f"{ns[k]:,.0f} ({calls[k]})" for k in PARSERS), f"{ratio:.2f}×"])
            results.append({"tokens": tokens, "chunks_per_read": per_read, "sink_calls_per_stream": calls,
                            "cpu_ns_per_chunk": ns, "httptools_over_hand_written": round(ratio, 3)})
    print("\n".join(aligned_rows(rows)))
    save_json(HERE / "results" / "http1_codec.json", {
        "python": platform.python_version(), "httptools": httptools.__version__, "h11": h11.__version__,
        "machine": platform.machine(), "results": results,
    })


if __name__ == "__main__":
    main()
