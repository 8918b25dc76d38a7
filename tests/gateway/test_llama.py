"""The gateway's timings against a real llama.cpp server agree with the client's own measurement.

The official `openai` SDK streams chat and completions through `slogate gateway` to llama-cpp-python
(Gemma 3 270M, CPU). That server sends no usage in streams, so tokens come from chunk counting.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from tests.realservers import LLAMA_BAN_EOS, start_gateway
from tests.servers import Server

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(180)]

PROMPT = "Write a short story about a lighthouse keeper and the sea."
# (endpoint, max_tokens) per measured request; llama.cpp serves them one at a time.
PLAN = [("chat", 6), ("completions", 6), ("chat", 10), ("completions", 10), ("chat", 14),
        ("completions", 14), ("chat", 8), ("completions", 8), ("chat", 12), ("completions", 12)]  # fmt: skip
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_OUTPUT = re.compile(rb'"(?:content|text)"\s*:\s*"[^"]')  # an output-bearing chunk, as the observer sees it


class _WireClock(httpx2.BaseTransport):
    """The client's own clock on the wire, under the SDK (httpx2 is this openai SDK's HTTP library).

    `sent_at`: the built request goes to the socket; `first_output_at`: the first response bytes
    carrying output (the gateway's TTFT definition, DESIGN §2); `last_byte_at`: the body's end.
    Timing here leaves out the SDK's request building and chunk parsing, which no proxy can see.
    """

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()
        self.sent_at = self.last_byte_at = 0.0
        self.first_output_at: float | None = None

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent_at, self.first_output_at = time.perf_counter(), None
        response = self.inner.handle_request(request)
        return httpx2.Response(response.status_code, headers=response.headers, stream=_TimedBody(response, self),
                               extensions=response.extensions)  # fmt: skip

    def close(self) -> None:
        self.inner.close()


class _TimedBody(httpx2.SyncByteStream):
    def __init__(self, response: httpx2.Response, clock: _WireClock) -> None:
        self.response, self.clock = response, clock

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.response.stream:
            now = time.perf_counter()
            if self.clock.first_output_at is None and _OUTPUT.search(piece):
                self.clock.first_output_at = now
            self.clock.last_byte_at = now
            yield piece

    def close(self) -> None:
        self.response.close()


def _stream(client: openai.OpenAI, clock: _WireClock, kind: str, max_tokens: int) -> dict:
    """One streamed request: the client's TTFT/E2E on the wire and as the SDK delivers it, chunk count."""
    extra = {"logit_bias": LLAMA_BAN_EOS}  # forces exactly max_tokens tokens (DESIGN §7)
    if kind == "chat":
        stream = client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=max_tokens, temperature=0, seed=1, stream=True,
                                                extra_body=extra)  # fmt: skip
    else:
        stream = client.completions.create(model="gemma", prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                           seed=1, stream=True, extra_body=extra)  # fmt: skip
    first: float | None = None
    chunks = 0
    finish = None
    for chunk in stream:
        assert chunk.usage is None, "the gateway's injected usage chunk reached a client that did not ask"
        for choice in chunk.choices:
            text = choice.delta.content if kind == "chat" else choice.text
            if text:
                chunks += 1
                if first is None:
                    first = time.perf_counter()
            finish = choice.finish_reason or finish
    assert first is not None and clock.first_output_at is not None, f"{kind} stream carried no output"
    t0 = clock.sent_at
    return {"kind": kind, "max_tokens": max_tokens, "chunks": chunks, "finish": finish,
            "ttft": clock.first_output_at - t0, "e2e": clock.last_byte_at - t0, "sdk_ttft": first - t0}  # fmt: skip


def _records(trace_dir: Path, n: int, timeout: float = 15.0) -> list[RequestRecord]:
    """The first `n` measured records of the gateway's trace (the writer flushes about every second)."""
    deadline = time.monotonic() + timeout
    records: list[RequestRecord] = []
    while time.monotonic() < deadline:
        if any(trace_dir.glob("*.jsonl.zst")):
            records = [r for r in read_trace(trace_dir).records if r.endpoint in ENDPOINTS.values()]
            if len(records) >= n:
                return records
        time.sleep(0.2)
    raise AssertionError(
        f"gateway trace in {trace_dir} has {len(records)} records after {timeout}s, expected {n}"
    )


def test_gateway_timings_match_client_against_llama_cpp(llama_server: Server, tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    with start_gateway(
        llama_server.url, trace_dir=trace_dir, extra_args=["--trace-flush-interval", "0.2"]
    ) as gw:
        clock = _WireClock()
        http = httpx2.Client(transport=clock, timeout=60)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0, http_client=http)
        _stream(client, clock, "completions", 2)  # warm-up (first prefill allocates buffers); not compared
        seen = [_stream(client, clock, kind, n) for kind, n in PLAN]
        http.close()
        records = _records(trace_dir, len(PLAN) + 1)[1:]

    assert len(records) == len(PLAN)
    ttft_diffs, e2e_diffs, sdk_diffs, tpot_diffs = [], [], [], []
    for client_side, rec in zip(seen, records, strict=True):
        where = f"{client_side['kind']} max_tokens={client_side['max_tokens']}: client {client_side} gateway {rec}"
        assert rec.endpoint == ENDPOINTS[client_side["kind"]], where
        assert rec.status == 200 and rec.error is None, where
        assert rec.stream is True, where
        # llama.cpp sends no usage in streams: the gateway counts output-bearing chunks.
        assert rec.tokens_source == "chunks", where
        assert rec.output_tokens == client_side["chunks"] == client_side["max_tokens"], where
        assert rec.finish_reason == client_side["finish"] == "length", where
        # The gateway's window (request head in → first output out) lies inside the client's.
        assert 0 < rec.ttft <= client_side["ttft"] + 0.001, where
        assert rec.ttft <= rec.e2e <= client_side["e2e"] + 0.001, where
        ttft_diffs.append(client_side["ttft"] - rec.ttft)
        e2e_diffs.append(client_side["e2e"] - rec.e2e)
        sdk_diffs.append(client_side["sdk_ttft"] - rec.ttft)
        # TPOT by the one definition from the client's numbers: close per request (a CPU hiccup on this
        # shared machine can delay one first chunk), within 1 ms at the median (below).
        client_tpot = (client_side["e2e"] - client_side["ttft"]) / (client_side["chunks"] - 1)
        assert rec.tpot == pytest.approx(client_tpot, rel=0.25, abs=0.002), where
        tpot_diffs.append(abs(client_tpot - rec.tpot))
        assert rec.itl is not None and rec.itl.count == rec.output_tokens - 1, where

    ms = lambda diffs: sorted(round(d * 1e3, 2) for d in diffs)  # noqa: E731
    print(
        f"client − gateway, ms: TTFT {ms(ttft_diffs)}; E2E {ms(e2e_diffs)}; SDK-delivered TTFT {ms(sdk_diffs)}"
    )
    # Two loopback hops and two process wake-ups separate the windows; on this shared 2-core VM the
    # medians stayed under 5 ms in every earlier CI run, then were 3–10 ms in a slower hour, against TTFTs of
    # 160–290 ms here: within 10 ms (under 5 % of a TTFT).
    assert statistics.median(ttft_diffs) <= 0.010, f"TTFT client − gateway (s): {ttft_diffs}"
    assert statistics.median(e2e_diffs) <= 0.010, f"E2E client − gateway (s): {e2e_diffs}"
    assert statistics.median(tpot_diffs) <= 0.001, f"|TPOT client − gateway| (s): {tpot_diffs}"
    # As the SDK hands chunks to the caller (adds its own parsing): a looser bound.
    assert statistics.median(sdk_diffs) <= 0.020, f"SDK-delivered TTFT − gateway TTFT (s): {sdk_diffs}"
