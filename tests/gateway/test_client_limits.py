"""Client-side limits of a real `slogate gateway` (gateway/client_limits.py): slowloris sockets under a
200-fd limit leave it serving, slow bodies and idle connections are closed and counted, and a client
beyond the cap gets a clean 503 rather than a reset."""

from __future__ import annotations

import contextlib
import shutil
import socket
import time
from collections.abc import Iterator

import pytest

from tests import hostile_upstream
from tests.gateway.fixtures_gateway import http_request, metric_samples, metric_sum, start_gateway
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)
PARTIAL = b"GET / HTTP/1.1\r\nHost: x\r\n"  # a header that never ends


@contextlib.contextmanager
def sockets(port: int, n: int, first: bytes) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if first:
                s.sendall(first)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_peer(s: socket.socket, timeout: float) -> bytes | None:
    """What the gateway wrote before closing `s` (None if it is still open after `timeout`)."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data


def poll(cond, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def ok(port: int) -> bool:
    status, _, body = http_request(f"http://127.0.0.1:{port}", "POST", "/v1/ok?id=probe", b"{}",
                                   {"Content-Type": "application/json"}, timeout=5)
    return status == 200 and body == hostile_upstream.body_for(b"probe")


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_250_slowloris_sockets_under_a_200_fd_limit_leave_the_gateway_serving():
    assert shutil.which("prlimit"), "prlimit (Debian util-linux) is needed for this test"
    with hostile_upstream.in_thread() as url, \
            start_gateway(url, "--client-header-timeout", "3", wrapper=["prlimit", "--nofile=200:200", "--"]) as gw:
        with sockets(gw.port, 250, PARTIAL) as idle:
            for _ in range(5):  # while all 250 are open: served, not reset
                assert ok(gw.port)
            samples = metric_samples(gw.admin_url)
            assert metric_sum(samples, "slogate_client_connections_shed_total", action="evicted_idle") >= 250 - 200
            assert metric_sum(samples, "slogate_client_connections") <= 200 - 64
            assert closed_by_peer(idle[-1], 10) == b""  # the header deadline closes the last one too
        assert poll(lambda: metric_sum(metric_samples(gw.admin_url), "slogate_client_timeouts_total", phase="header") >= 1)
        assert ok(gw.port)


def test_slow_bodies_are_closed_and_a_client_beyond_the_cap_gets_503():
    head = (b"POST /v1/ok HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            b"{\"a\":")
    admin = free_port()
    with hostile_upstream.in_thread() as url, \
            start_gateway(url, "--max-client-connections", "3", "--client-body-timeout", "1",
                          "--client-body-min-rate", "1000000", "--admin-listen", f"127.0.0.1:{admin}") as gw:
        admin_url = f"http://127.0.0.1:{admin}"
        with sockets(gw.port, 3, head) as slow:  # 3 connections busy reading a slow body fill the cap
            assert poll(lambda: metric_sum(metric_samples(admin_url), "slogate_client_connections", state="busy") == 3)
            extra = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
            with extra:
                answer = closed_by_peer(extra, 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 503 ") and b"too many client connections" in answer
            for s in slow:
                answer = closed_by_peer(s, 10)
                assert answer is not None and b"200 OK" not in answer
        samples = metric_samples(admin_url)
        assert metric_sum(samples, "slogate_client_timeouts_total", phase="body") == 3
        assert metric_sum(samples, "slogate_client_connections_shed_total", action="rejected_503") >= 1
        assert ok(gw.port)


def test_idle_keepalive_connections_close_after_seconds_not_an_hour():
    with hostile_upstream.in_thread() as url, start_gateway(url, "--client-keepalive-timeout", "0.5") as gw:
        with sockets(gw.port, 1, b"") as (silent,), sockets(gw.port, 1, b"") as (used,):
            used.sendall(b"POST /v1/ok?id=k HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            t0 = time.monotonic()
            answer = closed_by_peer(used, 10)
            assert answer is not None and answer.endswith(hostile_upstream.body_for(b"k"))
            assert closed_by_peer(silent, 10) == b""
            assert time.monotonic() - t0 < 5
        assert metric_sum(metric_samples(gw.admin_url), "slogate_client_timeouts_total", phase="idle") >= 2


@pytest.mark.slow  # 2,000 connections: ~12 s
def test_2000_malformed_requests_write_at_most_10_log_lines():
    bad = (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"\x16\x03garbage\r\n\r\n",
           b"POST /v1/x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
    with hostile_upstream.in_thread() as url, start_gateway(url) as gw:
        before = len(gw.log_text().splitlines())
        for i in range(2000):
            with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
                s.sendall(bad[i % 3])
                answer = closed_by_peer(s, 5)
                assert answer is not None and answer[:13] in (b"HTTP/1.1 400 ", b"HTTP/1.0 400 "), answer
        assert ok(gw.port)
        lines = gw.log_text().splitlines()[before:]
        assert 1 <= len(lines) <= 10 and "malformed client requests" in lines[0], lines[:12]
