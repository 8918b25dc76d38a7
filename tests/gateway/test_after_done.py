"""Nothing after `data: [DONE]`: a real `slogate gateway` in front of tests/hostile_upstream.py streams
that misbehave once their `[DONE]` went out (more events, a close, a reset, silence). The client's
stream ends at `[DONE]` with nothing appended, and the record says the request succeeded with the
output before `[DONE]`, timed to the `[DONE]` event."""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httptools
import orjson
import pytest

from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from tests import hostile_upstream
from tests.gateway.fixtures_gateway import trace_records
from tests.realservers import start_gateway
from tests.servers import Server

pytestmark = pytest.mark.timeout(60)
IDLE_S = 1.0  # the gateway's --idle-timeout: what a silent upstream after [DONE] costs at most


@dataclass
class Gw:
    server: Server
    trace_dir: Path
    sent: int = 0


@pytest.fixture(scope="module")
def gw() -> Iterator[Gw]:
    with tempfile.TemporaryDirectory(prefix="slogate-done-") as tmp, hostile_upstream.in_thread() as url, \
            start_gateway(url, trace_dir=Path(tmp) / "t",
                          extra_args=("--idle-timeout", f"{IDLE_S}", "--trace-flush-interval", "0.1")) as server:
        yield Gw(server, Path(tmp) / "t")


def stream(gw: Gw, case: str, stream_value: object = True) -> tuple[bytes, float, RequestRecord]:
    """POST a streaming chat answered by `case`: (client body, seconds until the response ended, record)."""
    body = orjson.dumps({"model": "m", "stream": stream_value, "messages": [{"role": "user", "content": "x"}]})
    head = (b"POST /v1/chat/completions?case=%s&id=%d HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (case.encode(), gw.sent, len(body)))
    gw.sent += 1
    done: list[bytes] = []

    class Collect:
        def __init__(self) -> None:
            self.chunks: list[bytes] = []

        def on_body(self, data: bytes) -> None:
            self.chunks.append(data)

        def on_message_complete(self) -> None:
            done.append(b"".join(self.chunks))

    parser = httptools.HttpResponseParser(Collect())
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(head + body)
        with contextlib.suppress(ConnectionResetError):
            while not done and (data := s.recv(65536)):
                parser.feed_data(data)
        waited = time.monotonic() - t0
    assert done, "the response did not end"
    records = trace_records(gw.trace_dir, gw.sent)
    return done[0], waited, records[-1]


def assert_clean(body: bytes, record: RequestRecord) -> None:
    assert body == hostile_upstream.STREAM, body  # byte for byte what came before [DONE], nothing after
    assert record.status == 200 and record.error is None and record.stream, record
    assert record.output_tokens == 2 and record.tokens_source == "chunks", record


def test_a_clean_stream_is_relayed_as_is(gw: Gw) -> None:
    body, _, record = stream(gw, "sse")
    assert_clean(body, record)


def test_events_after_done_are_not_forwarded_or_counted(gw: Gw) -> None:
    body, _, record = stream(gw, "after-done")
    assert_clean(body, record)


@pytest.mark.parametrize("case", ["cut-after-done", "reset-after-done", "hang-after-done"])
def test_an_upstream_failing_after_done_ends_the_stream_cleanly(gw: Gw, case: str) -> None:
    body, waited, record = stream(gw, case)
    assert_clean(body, record)
    assert record.e2e <= waited and waited < IDLE_S + 2, (record.e2e, waited)


def test_the_trace_has_one_record_per_stream(gw: Gw) -> None:
    """Whatever the outcome above, every stream sent became exactly one record (none lost, none doubled)."""
    stream(gw, "sse")
    assert len(list(read_trace(gw.trace_dir).records)) == gw.sent


def test_a_timed_out_stream_records_how_long_the_client_waited(gw: Gw) -> None:
    """The upstream sends one event and goes quiet: the idle deadline ends the stream; the record's e2e
    is the client's wait, not the time of the last byte that arrived."""
    body, waited, record = stream(gw, "stall")
    assert body.endswith(b"data: [DONE]\n\n") and b'"code":"timeout_idle"' in body, body
    assert record.error == "timeout_idle", record
    assert record.e2e is not None and waited >= IDLE_S
    assert waited - 0.3 <= record.e2e <= waited, (record.e2e, waited)  # the wait, less the client's own hops


def test_stream_is_recorded_as_the_upstream_answered(gw: Gw) -> None:
    """`"stream": "yes"` is not `true` (so not a streaming request by the API's rules), but this
    upstream streamed: the record says stream, the way it was answered."""
    body, _, record = stream(gw, "sse", stream_value="yes")
    assert body == hostile_upstream.STREAM
    assert record.stream is True and record.output_tokens == 2, record
