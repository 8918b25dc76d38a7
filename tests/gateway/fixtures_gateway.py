"""Helpers for the gateway tests: start `slogate gateway` in front of `slogate sim`, read its
/metrics and traces, and compare responses modulo the ids and timestamps the simulator randomizes.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from tests import realservers
from tests.servers import Server

SIM_MODEL = "llama-3-8b"
CANARY = "canary-7f3a9c1e-d00d"  # must never appear in any byte the gateway writes
_IDS = re.compile(rb'"id"\s*:\s*"[^"]*"')
_CREATED = re.compile(rb'"created"\s*:\s*\d+')


@contextlib.contextmanager
def start_gateway(
    upstreams: str | Sequence[str],
    *args: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    wrapper: Sequence[str] = (),
) -> Iterator[Server]:
    """`slogate gateway --listen 127.0.0.1:PORT --upstream … ARGS…` as a subprocess, ready at /healthz."""
    with realservers.start_gateway(upstreams, port=port, extra_args=args, timeout=timeout, env=env,
                                   wrapper=wrapper) as server:
        yield server


def normalize(data: bytes) -> bytes:
    """Response bytes with the simulator's random ids and creation times blanked."""
    return _CREATED.sub(b'"created":0', _IDS.sub(b'"id":"-"', data))


def http_request(url: str, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request: (status, headers, body bytes); any status, no exceptions for 4xx/5xx."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def get_json(url: str) -> dict:
    return orjson.loads(get(url))


def metric_samples(url: str) -> dict[str, list]:
    """`/metrics` parsed: sample name → list of (labels, value)."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(get(url + "/metrics").decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def metric_sum(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def sim_running(sim_url: str) -> float:
    text = get(sim_url + "/metrics").decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:num_requests_running":
                return s.value
    raise AssertionError("vllm:num_requests_running missing from the simulator's /metrics")


def read_until_close(s: socket.socket, timeout: float) -> bytes:
    """Everything the peer writes on `s` until it closes (a reset ends it too); a read waiting past
    `timeout` raises TimeoutError."""
    s.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            data += chunk
    return data


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def read_records(trace_dir: Path) -> list[RequestRecord]:
    """The records of the gateway's trace written so far (none before its first segment)."""
    if not trace_dir.exists() or not any(trace_dir.glob("*.jsonl.zst")):
        return []
    return list(read_trace(trace_dir).records)


def trace_records(trace_dir: Path, n: int, timeout: float = 10.0) -> list[RequestRecord]:
    """At least `n` records of the gateway's trace (the writer flushes a frame about every second)."""
    records = wait_for(lambda: (lambda r: r if len(r) >= n else None)(read_records(trace_dir)), timeout=timeout)
    assert records, f"fewer than {n} records in {trace_dir} after {timeout}s: {len(read_records(trace_dir))}"
    return records


class ChatSender:
    """Sends `n` chat requests (each must answer 200) to a gateway; `sent` counts them all."""

    def __init__(self, url: str, body: bytes) -> None:
        self.url, self.body, self.sent = url, body, 0

    def __call__(self, n: int) -> None:
        for _ in range(n):
            self.sent += 1
            assert http_request(self.url, "POST", "/v1/chat/completions", self.body,
                                {"Content-Type": "application/json"})[0] == 200


def trace_counts(admin_url: str) -> tuple[float, float]:
    """The capture's records so far as (written, dropped), from the gateway's /metrics."""
    samples = metric_samples(admin_url)
    return (metric_sum(samples, "slogate_trace_records_total", outcome="written"),
            metric_sum(samples, "slogate_trace_records_total", outcome="dropped"))



def chat_conversation(c: int, turns: int, send: Callable[[bytes], dict]) -> None:
    """Conversation `c`: a system prompt of its own, then `turns` user turns, each sent (`send`: the
    request body → the answer's JSON) with the whole history so far, the answers appended to it."""
    messages = [{"role": "system", "content": f"conversation {c}: " + "house rules " * 30}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        answer = send(orjson.dumps({"model": SIM_MODEL, "max_tokens": 3, "messages": messages}))
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})


def capture_with_two_workers(trace: Path, converse: Callable[[str, int], None], conversations: int,
                             requests: int) -> None:
    """A sim behind `slogate gateway --workers 2` capturing into `trace`: `converse(url, c)` for every
    conversation, then until the `requests` records are written (none dropped)."""
    from tests.simserver import start_sim

    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, realservers.start_gateway(
        sim.url, trace_dir=trace, extra_args=("--workers", "2", "--trace-flush-interval", "0.1"),
    ) as gw:
        for c in range(conversations):
            converse(gw.url, c)
        assert wait_for(lambda: trace_counts(gw.admin_url) == (requests, 0), timeout=10), trace_counts(gw.admin_url)
