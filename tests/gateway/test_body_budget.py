"""Request-body memory against a real gateway in front of the real simulator: bodies are held about once
(8 concurrent 30 MiB bodies raise the gateway's peak RSS by less than twice their total), a body beyond
the in-flight budget gets an OpenAI-style 503 and is counted, and the gateway keeps serving.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading

import orjson
import pytest

from slogate.gateway.cli import build_parser, overrides
from slogate.gateway.config import build_config, merge, read_toml
from slogate.traces.usage import UsageError
from tests.gateway.fixtures_gateway import (
    SIM_MODEL,
    http_request,
    metric_samples,
    metric_sum,
    start_gateway,
    wait_for,
)
from tests.simserver import start_sim

MiB = 1 << 20
PATH = "/v1/completions"


def padded(size: int, *, stream: bool = True) -> bytes:
    """A valid completion request of `size` bytes; the bulk is a field the simulator ignores, so it stays fast.
    `stream` without include_usage: the gateway rewrites the body to ask for usage (its costliest path)."""
    head = {"model": SIM_MODEL, "prompt": "hi", "max_tokens": 2, "stream": stream, "metadata": {"pad": ""}}
    pad = size - len(orjson.dumps(head))
    head["metadata"]["pad"] = "x" * pad
    body = orjson.dumps(head)
    assert len(body) == size
    return body


def proc_status(pid: int, key: str) -> int:
    """A /proc/PID/status size (VmRSS, VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"{key} missing from /proc/{pid}/status")


def inflight(admin_url: str) -> float:
    return metric_sum(metric_samples(admin_url), "slogate_client_body_bytes_inflight")


def post(port: int, body: bytes, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.append((resp.status, resp.read()))
    finally:
        conn.close()


@pytest.mark.parametrize("n, mib", [pytest.param(4, 16, id="4x16MiB"),
                                    pytest.param(8, 30, id="8x30MiB", marks=pytest.mark.slow)])  # the issue's
def test_concurrent_large_bodies_raise_peak_rss_by_less_than_twice_their_total(n: int, mib: int):
    size = mib * MiB
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, start_gateway(sim.url) as gw:
        warm: list = []
        post(gw.port, padded(200), warm)
        assert warm[0][0] == 200
        pid = gw.proc.pid
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS: the peak below is this run's
        base = proc_status(pid, "VmRSS")
        body = padded(size)
        out: list = []
        threads = [threading.Thread(target=post, args=(gw.port, body, out)) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        peak = proc_status(pid, "VmHWM")
        assert [s for s, _ in out] == [200] * n, [r[:200] for _, r in out]
        assert all(r.endswith(b"data: [DONE]\n\n") for _, r in out)
        increase = peak - base
        print(f"peak RSS increase {increase / MiB:.0f} MiB for {n} x {size // MiB} MiB = {increase / (n * size):.2f}x")
        assert increase < 2 * n * size, f"peak RSS rose {increase / MiB:.0f} MiB for {n * size // MiB} MiB of bodies"
        assert wait_for(lambda: inflight(gw.admin_url) == 0, timeout=10)


def _partial(port: int, body: bytes, sent: int) -> socket.socket:
    """A request whose head announces all of `body` but only `sent` bytes of it arrived."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body[:sent])
    return sock


def _refused(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` (a head, maybe a body the gateway will refuse when its last byte arrives) and read the
    answer to the end of the connection: nothing is left unread, so no reset hides the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, dict(resp.getheaders()), resp.read()


def _head(length: int | None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()


def test_a_body_beyond_the_in_flight_budget_gets_503_and_the_gateway_keeps_serving():
    held_body, other = padded(3 * MiB), padded(2 * MiB)
    with start_sim(timing="constant", ttft_ms=5, itl_ms=1) as sim, \
            start_gateway(sim.url, "--max-body-bytes", str(3 * MiB), "--max-inflight-body-bytes", str(4 * MiB)) as gw:
        with contextlib.closing(_partial(gw.port, held_body, MiB)) as held:
            assert wait_for(lambda: inflight(gw.admin_url) == 3 * MiB, timeout=10)  # taken at the head
            status, headers, raw = _refused(gw.port, _head(len(other)))  # answered at its head
            assert status == 503, raw[:300]
            error = orjson.loads(raw)["error"]
            assert error["code"] == "body_budget" and error["type"] == "server_error"
            assert "--max-inflight-body-bytes" in error["message"] and str(4 * MiB) in error["message"]
            assert headers.get("Retry-After") == "1" and headers.get("Connection") == "close"
            # a chunked body is taken as it arrives: refused when it crosses the budget (here at its last byte)
            n = MiB + 1
            assert _refused(gw.port, _head(None) + b"%x\r\n" % n + b"x" * n)[0] == 503
            assert http_request(gw.url, "POST", PATH, padded(500))[0] == 200  # small bodies still fit
            held.sendall(held_body[MiB:])  # the held request completes and is answered
            resp = http.client.HTTPResponse(held)
            resp.begin()
            assert resp.status == 200 and resp.read().endswith(b"data: [DONE]\n\n")
        assert wait_for(lambda: inflight(gw.admin_url) == 0, timeout=10)
        with contextlib.closing(_partial(gw.port, held_body, MiB)):  # a client that leaves mid-body gives it back
            assert wait_for(lambda: inflight(gw.admin_url) == 3 * MiB, timeout=10)
        assert wait_for(lambda: inflight(gw.admin_url) == 0, timeout=10)
        assert http_request(gw.url, "POST", PATH, other)[0] == 200  # the budget is whole again
        assert _refused(gw.port, _head(3 * MiB + 1))[0] == 413  # one body over --max-body-bytes
        samples = metric_samples(gw.admin_url)
        assert metric_sum(samples, "slogate_client_requests_rejected_total", reason="body_budget") == 2
        assert metric_sum(samples, "slogate_client_requests_rejected_total", reason="body_too_large") == 1
        assert metric_sum(samples, "slogate_client_body_bytes_budget") == 4 * MiB


def _config(argv: list[str], toml: str = "", tmp_path=None):  # type: ignore[no-untyped-def]
    data = {"upstreams": ["http://127.0.0.1:8000"]}
    if toml:
        path = tmp_path / "slogate.toml"
        path.write_text(toml)
        data = merge(read_toml(path), {})
    return build_config(merge(data, overrides(build_parser().parse_args(argv))))


def test_the_budget_comes_from_toml_or_the_flag_and_must_hold_one_largest_body(tmp_path):
    assert _config([]).max_inflight_body_bytes == 256 * MiB
    toml = '[gateway]\nupstreams = ["http://127.0.0.1:8000"]\nmax_inflight_body_bytes = 67108864\n'
    assert _config([], toml, tmp_path).max_inflight_body_bytes == 64 * MiB
    assert _config(["--max-inflight-body-bytes", str(48 * MiB)], toml, tmp_path).max_inflight_body_bytes == 48 * MiB
    with pytest.raises(UsageError) as exc:
        _config(["--max-inflight-body-bytes", str(MiB)])  # below the 32 MiB --max-body-bytes
    message = str(exc.value)
    assert "\n" not in message and "--max-inflight-body-bytes" in message and str(MiB) in message
    assert "at least max_body_bytes" in message
