"""Fuzz a real `slogate gateway` (in front of `slogate sim`) with hostile HTTP/1.1 over raw sockets.

Hypothesis builds request lines, headers, Content-Length/Transfer-Encoding combinations, chunk
sizes and request trailers, pipelines them, splits the sends, and cuts connections (silently or with a
half-close) or drops them. It checks what a client sees, never the gateway's internals: every answer is
well-formed HTTP/1.1 (parsed by llhttp through httptools), the gateway keeps serving after each case, no record is lost
and no secret or client address reaches the trace, the logs, the access log or /metrics.
Fast tier: 25 cases (~2–8 s); `slow`: 1,000 cases (~35–60 s: most of it the cut cases that wait out the deadline).
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import (
    CANARY,
    SIM_MODEL,
    get,
    metric_samples,
    metric_sum,
    read_until_close,
    wait_for,
)
from tests.realservers import start_gateway
from tests.servers import Server, free_port
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(600)
SECRET = CANARY.encode()
CLIENT_TIMEOUT_S = 1.0  # header, body and keep-alive deadlines of the gateway under test
PATHS = [b"/v1/chat/completions", b"/v1/completions", b"/healthz", b"/v1/models", b"/nope", b"*",
         b"http://h/v1/models", b"/v1/chat/completions?q=" + SECRET, b"/%00", b"/v1/../healthz"]
VERSIONS = [b"HTTP/1.1"] * 6 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.x", b"", b"HTTP/1.1 ", b"http/1.1"]
SECRET_HEADERS = [(b"Authorization", b"Bearer sk-" + SECRET), (b"api-key", SECRET), (b"Cookie", b"s=" + SECRET),
                  (b"X-Api-Key", SECRET)]
ODD_HEADERS = [(b"X-A", b"1\r\n folded"), (b"X A", b"1"), (b"X-A", b"\x00\x7f"), (b"", b"x"), (b"X-Long", b"v" * 9000),
               (b"Host", b"second"), (b"Expect", b"100-continue"), (b"Connection", b"close"),
               (b"Connection", b"keep-alive"), (b"Upgrade", b"h2c"), (b"X-A", b"\xff\xfe")]
FRAMINGS = ["none", "cl", "cl", "cl_short", "cl_long", "cl_dup_same", "cl_dup_diff", "cl_bad", "chunked", "chunked",
            "chunked_trailer", "te_gzip_chunked", "te_chunked_gzip", "te_cl", "te_dup", "chunked_bad_size"]
BAD_CL = [b"+5", b"-1", b"0x5", b"5 5", b"99999999999999999999", b"", b"5,5"]
BAD_SIZES = [b"0x5", b"zz", b"-5", b"5_0", b"ffffffffffffffffffff", b"5 5", b""]


@dataclass
class Req:
    wire: bytes
    valid: bool  # a well-formed request the gateway must answer and keep the connection for


@dataclass
class Case:
    reqs: list[Req]
    mode: str  # sentinel (then GET /healthz, Connection: close) | cut (a prefix, then wait) | drop (send, close)
    cut: int
    splits: list[int]
    eof: bool = False  # with cut: the client then half-closes (shutdown SHUT_WR) instead of waiting silently

    def wire(self) -> bytes:
        return b"".join(r.wire for r in self.reqs)


def _chunks(body: bytes, sizes: list[int], ext: bool) -> bytes:
    out, i = b"", 0
    for size in sizes:
        piece = body[i : i + size]
        if not piece:
            break
        out += b"%x%s\r\n%s\r\n" % (len(piece), b";x=y" if ext else b"", piece)
        i += len(piece)
    if i < len(body):
        out += b"%X\r\n%s\r\n" % (len(body) - i, body[i:])
    return out


@st.composite
def requests(draw: st.DrawFn) -> Req:
    valid = draw(st.booleans())
    stream = draw(st.booleans())
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 3, "stream": stream,
                         "messages": [{"role": "user", "content": f"hello {CANARY}"}]})
    if valid:
        method, path = draw(st.sampled_from([(b"POST", b"/v1/chat/completions"), (b"GET", b"/v1/models"),
                                             (b"GET", b"/healthz"), (b"GET", b"/nope"), (b"POST", b"/v1/completions")]))
        body = chat if path == b"/v1/chat/completions" else (
            orjson.dumps({"model": SIM_MODEL, "prompt": CANARY, "max_tokens": 2}) if method == b"POST" else b"")
        headers = [(b"Host", b"x"), *draw(st.lists(st.sampled_from(SECRET_HEADERS), max_size=2))]
        if body:
            headers.append((b"Content-Type", b"application/json"))
            if draw(st.booleans()):
                headers.append((b"Content-Length", b"%d" % len(body)))
            else:
                headers.append((b"Transfer-Encoding", b"chunked"))
                sizes = draw(st.lists(st.integers(1, 64), min_size=1, max_size=6))
                body = _chunks(body, sizes, draw(st.booleans())) + b"0\r\n\r\n"
        head = b"%s %s HTTP/1.1\r\n" % (method, path) + b"".join(b"%s: %s\r\n" % h for h in headers)
        return Req(head + b"\r\n" + body, True)
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT"])
                  | st.binary(min_size=1, max_size=8).filter(lambda m: m.upper() != b"HEAD"))
    path = draw(st.sampled_from(PATHS) | st.binary(max_size=12))
    version = draw(st.sampled_from(VERSIONS))
    eol = draw(st.sampled_from([b"\r\n"] * 5 + [b"\n"]))
    headers = [(b"Host", b"x")] if draw(st.booleans()) else []
    headers += draw(st.lists(st.sampled_from(SECRET_HEADERS + ODD_HEADERS)
                             | st.tuples(st.binary(max_size=10), st.binary(max_size=20)), max_size=5))
    body = draw(st.sampled_from([chat, b"{not json", b"", b"[]", b'{"model": 5}']) | st.binary(max_size=60))
    framing = draw(st.sampled_from(FRAMINGS))
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
    n = len(body)
    if framing == "cl":
        headers.append((b"Content-Length", b"%d" % n))
    elif framing in ("cl_short", "cl_long"):
        headers.append((b"Content-Length", b"%d" % max(0, n - 3 if framing == "cl_short" else n + 3)))
    elif framing == "cl_dup_same":
        headers += [(b"Content-Length", b"%d" % n)] * 2
    elif framing == "cl_dup_diff":
        headers += [(b"Content-Length", b"%d" % n), (b"Content-Length", b"%d" % (n + 1))]
    elif framing == "cl_bad":
        headers.append((b"Content-Length", draw(st.sampled_from(BAD_CL))))
    elif framing != "none":
        te = {"te_gzip_chunked": b"gzip, chunked", "te_chunked_gzip": b"chunked, gzip"}.get(framing, b"chunked")
        headers.append((b"Transfer-Encoding", te))
        if framing == "te_cl":
            headers.append((b"Content-Length", b"%d" % n))
        if framing == "te_dup":
            headers.append((b"Transfer-Encoding", b"chunked"))
        chunked = _chunks(body, sizes, draw(st.booleans()))
        if framing == "chunked_bad_size":
            chunked = draw(st.sampled_from(BAD_SIZES)) + b"\r\n" + body[:5] + b"\r\n"
        trailer = b"".join(b"%s: %s\r\n" % h for h in draw(st.lists(st.sampled_from(SECRET_HEADERS), min_size=1,
                                                                   max_size=2))) if framing == "chunked_trailer" else b""
        body = chunked + b"0\r\n" + trailer + b"\r\n"
    line = method + b" " + path + (b" " + version if version else b"") + eol
    return Req(line + b"".join(k + b": " + v + eol for k, v in headers) + eol + body, False)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    reqs = draw(st.lists(requests(), min_size=1, max_size=3))
    mode = draw(st.sampled_from(["sentinel"] * 6 + ["cut", "drop", "drop"]))
    total = sum(len(r.wire) for r in reqs)
    return Case(reqs, mode, draw(st.integers(0, max(0, total - 1))),
                draw(st.lists(st.integers(1, 300), max_size=6)), draw(st.sampled_from([True, True, False])))


@dataclass
class Answer:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


class _Collect:
    """httptools callbacks: one `Answer` per response on the connection, in order."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.cur: Answer | None = None
        self.parser: httptools.HttpResponseParser | None = None

    def on_message_begin(self) -> None:
        self.cur = Answer()

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.cur is not None
        self.cur.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self.cur is not None and self.parser is not None
        self.cur.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        assert self.cur is not None
        self.cur.body += body

    def on_message_complete(self) -> None:
        assert self.cur is not None
        self.answers.append(self.cur)
        self.cur = None


def parse_answers(data: bytes, cut_short_ok: bool = False) -> list[Answer]:
    """Every response in `data` (what the gateway wrote before closing); fails on malformed HTTP, and on a
    last response cut short unless `cut_short_ok` (the client half-closed: a stream it asked for is
    aborted, 499 in the trace as nginx logs it, and the rest of it never written)."""
    collect = _Collect()
    parser = httptools.HttpResponseParser(collect)
    collect.parser = parser
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise AssertionError(f"malformed response from the gateway ({exc}): {data[:500]!r}") from None
    assert cut_short_ok or collect.cur is None, f"response cut short: {data[-300:]!r}"
    return collect.answers


CLIENT_PORTS: set[int] = set()  # local ports of the fuzz connections: no client address may be written


def send_case(port: int, case: Case) -> bytes | None:
    """Send one case on a fresh connection; what came back (None for a dropped connection)."""
    wire = case.wire()
    if case.mode == "sentinel":
        wire += b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    elif case.mode == "cut":
        wire = wire[: case.cut]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        CLIENT_PORTS.add(s.getsockname()[1])
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the gateway may close first
            i = 0
            for size in [*case.splits, len(wire)]:
                s.sendall(wire[i : i + size])
                i += size
        if case.mode == "drop":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
            return None
        if case.mode == "cut" and case.eof:
            with contextlib.suppress(OSError):  # the gateway may have closed already
                s.shutdown(socket.SHUT_WR)
        # a cut request ends with the gateway's client deadline (or at once after the client's EOF); any
        # other case ends in a close
        return read_until_close(s, 10 * CLIENT_TIMEOUT_S + 20)


def good_request(port: int) -> None:
    """A plain streaming chat on a fresh connection completes with [DONE]."""
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 3, "stream": True,
                         "messages": [{"role": "user", "content": "after"}]})
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(chat))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + chat)
        answers = parse_answers(read_until_close(s, 30))
    assert [a.status for a in answers] == [200] and b"data: [DONE]" in answers[0].body, answers


@dataclass
class Fuzzed:
    gw: Server
    admin: str
    trace_dir: Path
    access_log: Path
    sent_chats: int = 0  # chat requests the gateway certainly relayed (the good request after each case)
    error_bodies: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # (status, content-type, body)


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Fuzzed]:
    """One gateway for all cases; at the end: records == measured requests, nothing secret written."""
    with tempfile.TemporaryDirectory(prefix="slogate-fuzz-") as tmp, \
            start_sim(timing="constant", ttft_ms=2, itl_ms=1) as sim:
        admin_port = free_port()
        trace_dir, access_log = Path(tmp) / "trace", Path(tmp) / "access.log"
        t = f"{CLIENT_TIMEOUT_S}"
        args = ("--admin-listen", f"127.0.0.1:{admin_port}", "--access-log", str(access_log),
                "--client-header-timeout", t, "--client-body-timeout", t, "--client-keepalive-timeout", t,
                "--trace-flush-interval", "0.2", "--log-level", "debug")
        with start_gateway(sim.url, trace_dir=trace_dir, extra_args=args) as gw:
            state = Fuzzed(gw, f"http://127.0.0.1:{admin_port}", trace_dir, access_log)
            yield state
            admin_bytes = get(state.admin + "/metrics") + get(state.admin + "/slogate/status")
            measured = metric_sum(metric_samples(state.admin), "slogate_requests_total")
            assert gw.stop() == 0
            log = gw.log_text()
        records = list(read_trace(trace_dir).records)
        assert len(records) == measured >= state.sent_chats, (len(records), measured, state.sent_chats)
        written = [admin_bytes, log.encode(), access_log.read_bytes()]
        dctx = zstandard.ZstdDecompressor()
        for path in trace_dir.iterdir():
            with dctx.stream_reader(path.read_bytes(), read_across_frames=True) as reader:
                written.append(reader.read())
        addresses = [b"127.0.0.1:%d" % p for p in CLIENT_PORTS]
        for blob in written:
            assert SECRET not in blob and b"sk-canary" not in blob
            assert not [a for a in addresses if a in blob], "a client address was written"


def run_case(state: Fuzzed, case: Case) -> None:
    data = send_case(state.gw.port, case)
    if data is not None:
        answers = parse_answers(data, cut_short_ok=case.mode == "cut" and case.eof)
        if case.mode == "sentinel" and all(r.valid for r in case.reqs):
            assert len(answers) == len(case.reqs) + 1, [a.status for a in answers]
            assert answers[-1].status == 200 and orjson.loads(answers[-1].body) == {"status": "ok"}
            state.sent_chats += sum(r.wire.startswith(b"POST /v1/chat/") for r in case.reqs)
        for a in answers:
            assert 100 <= a.status <= 599
            headers = dict(a.headers)
            if a.status >= 400 and a.body and b"server" not in headers:  # the gateway's own answer: the
                ctype = headers.get(b"content-type", b"")  # upstream's (aiohttp: `Server:`) are relayed as sent
                state.error_bodies.append((a.status, ctype, a.body))
    good_request(state.gw.port)
    state.sent_chats += 1
    assert wait_for(lambda: get(state.gw.url + "/healthz") == b'{"status":"ok"}', timeout=5)


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                print_blob=True)  # a profile: each test derives its example count from it


@settings(FUZZ, max_examples=25)
@given(case=cases())
def test_hostile_requests_leave_the_gateway_serving(fuzzed: Fuzzed, case: Case) -> None:
    run_case(fuzzed, case)


@pytest.mark.slow
@settings(FUZZ, max_examples=1000)
@given(case=cases())
def test_hostile_requests_many(fuzzed: Fuzzed, case: Case) -> None:
    run_case(fuzzed, case)


def test_slowloris_cut_is_closed_by_the_deadline(fuzzed: Fuzzed) -> None:
    """A request cut inside its head is closed within the header deadline (plus slack), not held."""
    with socket.create_connection(("127.0.0.1", fuzzed.gw.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-" + SECRET)
        t0 = time.monotonic()
        read_until_close(s, 15)
        assert time.monotonic() - t0 < CLIENT_TIMEOUT_S + 5
    good_request(fuzzed.gw.port)
    fuzzed.sent_chats += 1


@pytest.mark.slow  # in the fast tier only 25 fuzz cases run, which may draw no error the gateway answers itself
def test_every_error_body_is_openai_json(fuzzed: Fuzzed) -> None:
    """Runs after the fuzz cases in this module: every 4xx/5xx body the gateway itself answered was an
    OpenAI error (errors from the upstream are relayed unchanged)."""
    assert fuzzed.error_bodies, "the fuzz cases produced no error answers"
    for status, ctype, body in fuzzed.error_bodies:
        assert ctype.startswith(b"application/json"), (status, ctype, body[:200])
        err = orjson.loads(body)["error"]
        assert isinstance(err["message"], str) and "type" in err and "code" in err, body[:200]
