"""slogate side by side with independent clients (issue 20): AIPerf and guidellm stream chats through
the gateway to the real llama.cpp server, offline (the GGUF's own tokenizer in a local HF cache). Per
request, each client's TTFT and E2E are never below the gateway's and exceed them by ≤ 2 ms at the
median, both in all and from the gateway's t0 on (both clocks started when its loop has the request);
the time before t0 (the client's send, the request waiting in the gateway's socket) is printed.
`slogate replay --prompt-tokens content` on the same workload agrees with AIPerf within 5 %, each
figure over what the gateway saw of that client's own requests."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from slogate.replay.profiles import synthesize
from slogate.replay.run import ReplayOptions, replay
from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import wait_for
from tests.gateway.tokens_gguf import build_tokenizer_json
from tests.peer_clients import PeerRequest, run_aiperf, run_guidellm
from tests.realservers import (
    GEMMA_GGUF,
    LLAMA_BAN_EOS,
    MODEL_CACHE,
    gemma_model_path,
    start_gateway,
    start_llama,
)

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(600)]

INPUT_TOKENS, OUTPUT_TOKENS, REQUESTS, ROUNDS, WARMUP = 64, 16, 6, 2, 2
# guidellm's requests: its like-for-like median sat at 1.8-2.1 ms on the CI box over 12 (sampling noise
# of ~0.35 ms at that spread, where the bound is 2 ms); 36 cost ~11 s more and halve that noise.
GUIDELLM_REQUESTS = 36
BAN_EOS = {k: float(v) for k, v in LLAMA_BAN_EOS.items()}


class GatewayRequest(msgspec.Struct, frozen=True):
    """One streamed request as the gateway recorded it (seconds; start is UNIX time, at its t0)."""

    start: float
    ttft: float
    to_last_content: float  # TTFT + the chunk gaps (`itl.mean × itl.count`): where AIPerf's E2E ends
    output_tokens: int
    e2e: float  # to `[DONE]`: where guidellm's E2E ends


def _gateway_starts(trace_dir: Path, n: int) -> list[GatewayRequest]:
    """The gateway's streamed records, once at least `n` are written."""

    def read() -> list | None:
        if not any(trace_dir.glob("*.jsonl.zst")):
            return None
        trace = read_trace(trace_dir)
        rows = [GatewayRequest(trace.header.start_unix + r.t, r.ttft, r.ttft + r.itl.mean * r.itl.count,
                               r.output_tokens, r.e2e)  # type: ignore[arg-type]
                for r in trace.records if r.ttft is not None and r.itl is not None]
        return rows if len(rows) >= n else None

    rows = wait_for(read, timeout=20)
    assert rows, f"fewer than {n} streamed records in {trace_dir}"
    return rows


def _pair(peer: list[PeerRequest], gateway: list[GatewayRequest]) -> list[tuple[PeerRequest, GatewayRequest]]:
    """Each peer request with the gateway record that started nearest to it (one to one)."""
    pairs = []
    for p in peer:
        g = min(gateway, key=lambda row: abs(row.start - p.start))
        assert abs(g.start - p.start) < 0.5, (p, g)  # the same request, seen ~1 ms apart
        pairs.append((p, g))
    assert len({id(g) for _, g in pairs}) == len(pairs), "two peer requests matched one gateway record"
    return pairs


def _pin(pid: int, cpus: set[int]) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):  # every thread, not just the main one
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def _clients_off_the_server_core(server_pid: int, gateway_pid: int) -> Iterator[None]:
    """llama.cpp alone on the first CPU; the gateway, this process and what it starts (the peers'
    processes, the replay) on the others, so neither client's own CPU use slows the server it
    measures. (With the gateway beside llama.cpp instead, it waits for the busy server thread: the
    client − gateway TTFT median went to 6.5 ms, 1.5 ms of it after the gateway's t0.)

    A sidecar in production has a core when a request comes; here it shares one with a client of
    ~10 processes, which held it while the request waited in the gateway's socket (AIPerf: 2.6 ms
    median from its start to the gateway's t0, no gateway timestamp can include that). So the
    gateway runs at real-time priority (SCHED_FIFO 1) on the shared core: it reads a request, or a
    token, when it arrives, and the clients get the core whenever the gateway waits."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield
        return
    _pin(server_pid, {cpus[0]})
    os.sched_setaffinity(0, set(cpus[1:]))
    _pin(gateway_pid, set(cpus[1:]))
    try:
        for tid in os.listdir(f"/proc/{gateway_pid}/task"):  # threads it starts later inherit it
            os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        pytest.fail("the peer test runs the gateway at SCHED_FIFO priority 1 (a core of its own when it "
                    "needs one): that needs root or CAP_SYS_NICE")
    try:
        yield
    finally:
        os.sched_setaffinity(0, set(cpus))


class _WallClock:
    """The peers time requests by the wall clock (`time.time`), the gateway by the monotonic one from a
    wall-clock anchor: comparable only while the two clocks keep step. Once, mid-run on this VM, the
    wall clock moved 0.8 s against the monotonic one (then slewed ~130 ppm): a test that saw that says
    so instead of pairing requests across the jump."""

    def __init__(self) -> None:
        self.offset = time.time() - time.perf_counter()

    def check(self, bound_s: float = 0.001) -> None:
        moved = time.time() - time.perf_counter() - self.offset
        assert abs(moved) <= bound_s, (f"the wall clock moved {moved * 1e3:+.1f} ms against the monotonic clock during "
                                       "the run: the peers' wall-clock times cannot be compared with the gateway's")


def _check_agreement(name: str, pairs: list[tuple[PeerRequest, GatewayRequest]], end: str) -> None:
    """Client − gateway per request (the gateway's end: `to_last_content` or `e2e`, where the client's ends).

    The total splits in two at the gateway's t0 (its loop has the request head): `entry` = t0 − the
    client's start (the client's own send work, then the request waiting in the gateway's socket until
    its loop reads it: no gateway figure can include that), and the like-for-like rest, both clocks
    started at t0: client first token / end − gateway first token / end (the gateway's forwarding and
    the client's read). Never negative, each; the medians of the whole difference, and of the
    like-for-like part, ≤ 2 ms (issue 20's bound)."""
    entry = [g.start - p.start for p, g in pairs]
    d_ttft = [p.ttft - g.ttft for p, g in pairs]
    d_e2e = [p.e2e - getattr(g, end) for p, g in pairs]
    like_ttft = [d - e for d, e in zip(d_ttft, entry, strict=True)]
    like_e2e = [d - e for d, e in zip(d_e2e, entry, strict=True)]

    def ms(xs: list[float]) -> list[float]:
        return [round(x * 1e3, 2) for x in xs]

    med = statistics.median
    print(f"{name} client − gateway ms: TTFT {ms(d_ttft)} E2E {ms(d_e2e)}; entry (client start → gateway t0) "
          f"{ms(entry)}; client's own send work {ms([p.pre_send for p, _ in pairs])}")
    print(f"{name} medians ms: client − gateway TTFT {med(d_ttft) * 1e3:.2f}, E2E {med(d_e2e) * 1e3:.2f}; entry "
          f"{med(entry) * 1e3:.2f}; from t0 on: TTFT {med(like_ttft) * 1e3:.2f}, E2E {med(like_e2e) * 1e3:.2f}")
    assert min(d_ttft) >= 0 and min(d_e2e) >= 0, (d_ttft, d_e2e)
    assert min(entry) >= 0 and min(like_ttft) >= 0 and min(like_e2e) >= 0, (entry, like_ttft, like_e2e)
    assert med(like_ttft) <= 0.002 and med(like_e2e) <= 0.002, (like_ttft, like_e2e)
    assert med(d_ttft) <= 0.002 and med(d_e2e) <= 0.002, (d_ttft, d_e2e)


def test_aiperf_through_gateway_agrees_with_gateway_and_replay(tmp_path: Path) -> None:
    tokenizer = build_tokenizer_json(gemma_model_path(), MODEL_CACHE / GEMMA_GGUF.replace(".gguf", ".tokenizer.json"))
    with start_llama() as llama, start_gateway(llama.url, trace_dir=tmp_path / "trace",
                                                extra_args=["--tokenizer", str(tokenizer), "--chat-template", "gemma"]) as gw, \
            _clients_off_the_server_core(llama.proc.pid, gw.proc.pid):
        clock = _WallClock()
        peer: list[PeerRequest] = []
        ours: list = []
        ours_cpu: list[float] = []
        ours_windows: list[tuple[float, float]] = []  # UNIX time around each replay: its requests at the gateway
        peer_cpu = 0.0
        for k in range(ROUNDS):  # interleaved, so a change of the machine's load hits both clients alike
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            peer += run_aiperf(gw.url, tmp_path / f"aiperf{k}", input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                               requests=REQUESTS, warmup=WARMUP, extra_body={"logit_bias": BAN_EOS}, seed=k + 1)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            peer_cpu += (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            w = synthesize("concurrency:c=1", requests=REQUESTS, input_tokens=f"fixed:{INPUT_TOKENS}",
                           output_tokens=f"fixed:{OUTPUT_TOKENS}", seed=k)
            began = time.time()
            out = replay(w, ReplayOptions(target=gw.url, model="gemma", prompt_tokens="content", calibrate=False,
                                          tokenizer=str(tokenizer), force_output="logit-bias:" + json.dumps(BAN_EOS)))
            ours_windows.append((began, time.time()))
            assert out.results.summary.failed == 0, out.results.summary.errors_by_class
            ours += out.records
            ours_cpu.append(out.client_cpu_s)
        gateway = _gateway_starts(tmp_path / "trace", ROUNDS * (2 * REQUESTS + WARMUP))  # every one written
    clock.check()
    assert len(peer) == ROUNDS * REQUESTS and len(ours) == ROUNDS * REQUESTS, (len(peer), len(ours))
    # AIPerf counts output tokens by re-tokenizing the streamed text; the gateway counts content chunks
    print(f"AIPerf output tokens (re-tokenized text) {[p.output_tokens for p in peer]}, input {peer[0].input_tokens}")
    pairs = _pair(peer, gateway)
    print(f"AIPerf connect ms {[round(p.connect * 1e3, 2) for p in peer]}")
    # the replay's requests at the gateway: those inside a replay's window (AIPerf's warmups are not)
    at_gateway = [g for g in gateway if any(a <= g.start <= b for a, b in ours_windows)]
    assert len(at_gateway) == len(ours), (len(at_gateway), len(ours))
    server_peer = statistics.median(g.ttft for _, g in pairs)
    server_ours = statistics.median(g.ttft for g in at_gateway)
    print(f"gateway TTFT p50 of AIPerf's requests {server_peer * 1e3:.1f} ms, of the replay's {server_ours * 1e3:.1f} ms; "
          f"AIPerf CPU {peer_cpu:.1f} s for {len(peer)} requests, replay {sum(ours_cpu):.2f} s")
    ttft_peer, e2e_peer = statistics.median(p.ttft for p in peer), statistics.median(p.e2e for p in peer)
    ttft_ours, e2e_ours = statistics.median(r.ttft for r in ours), statistics.median(r.e2e for r in ours)
    print(f"TTFT p50 slogate {ttft_ours * 1e3:.1f} ms, AIPerf {ttft_peer * 1e3:.1f} ms ({ttft_ours / ttft_peer - 1:+.1%}); "
          f"E2E p50 slogate {e2e_ours * 1e3:.1f} ms, AIPerf {e2e_peer * 1e3:.1f} ms ({e2e_ours / e2e_peer - 1:+.1%})")
    assert all(g.output_tokens == OUTPUT_TOKENS for _, g in pairs), [g.output_tokens for _, g in pairs]
    assert all(r.output_tokens == OUTPUT_TOKENS for r in ours), [r.output_tokens for r in ours]
    # AIPerf's OSL re-tokenizes the decoded text, and generated tokens may re-merge (15 for 16 in 1 of
    # 12, in two runs): asserted as the estimate it is, right at the median and never off by more than
    # 2; the exact count is the gateway's (16 content chunks, above).
    osl = [p.output_tokens for p in peer]
    assert statistics.median(osl) == OUTPUT_TOKENS and all(abs(n - OUTPUT_TOKENS) <= 2 for n in osl), osl
    _check_agreement("AIPerf", pairs, end="to_last_content")  # AIPerf's E2E ends at the last content chunk
    # One set of definitions: each client's figure over what the gateway saw of that client's own requests.
    # (The raw medians differ by the server's speed: AIPerf's ~10 processes load the box it measures.)
    e2e_server_peer = statistics.median(g.to_last_content for _, g in pairs)
    e2e_server_ours = statistics.median(g.e2e for g in at_gateway)  # slogate's E2E ends at [DONE], as the gateway's
    ttft_ratio = (ttft_ours / server_ours) / (ttft_peer / server_peer)
    e2e_ratio = (e2e_ours / e2e_server_ours) / (e2e_peer / e2e_server_peer)
    print(f"client/gateway TTFT: slogate {ttft_ours / server_ours:.4f}, AIPerf {ttft_peer / server_peer:.4f}; "
          f"E2E: slogate {e2e_ours / e2e_server_ours:.4f}, AIPerf {e2e_peer / e2e_server_peer:.4f}")
    assert abs(ttft_ratio - 1) <= 0.05 and abs(e2e_ratio - 1) <= 0.05, (ttft_ratio, e2e_ratio)


def test_guidellm_through_gateway_agrees_with_gateway(tmp_path: Path) -> None:
    """guidellm 0.8.1 (torch 2.13.0 CPU build beside it) as the client: per request, its TTFT and its
    E2E (request headers written → stream closed after `[DONE]`) are never below the gateway's (head
    complete → first content chunk / `[DONE]`) and exceed them by ≤ 2 ms at the median. Its output
    count (llama.cpp streams no usage: one token per content chunk) equals the tokens generated."""
    tokenizer = build_tokenizer_json(gemma_model_path(), MODEL_CACHE / GEMMA_GGUF.replace(".gguf", ".tokenizer.json"))
    with start_llama() as llama, start_gateway(llama.url, trace_dir=tmp_path / "trace",
                                                extra_args=["--tokenizer", str(tokenizer), "--chat-template", "gemma"]) as gw, \
            _clients_off_the_server_core(llama.proc.pid, gw.proc.pid):
        clock = _WallClock()
        peer = run_guidellm(gw.url, tmp_path / "guidellm", input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                            requests=GUIDELLM_REQUESTS, extra_body={"logit_bias": BAN_EOS})
        gateway = _gateway_starts(tmp_path / "trace", GUIDELLM_REQUESTS)
    clock.check()
    assert len(peer) == GUIDELLM_REQUESTS, len(peer)
    pairs = _pair(peer, gateway)
    print(f"guidellm input tokens {[p.input_tokens for p in peer]}, gateway TTFT p50 "
          f"{statistics.median(g.ttft for _, g in pairs) * 1e3:.1f} ms")
    assert all(p.output_tokens == OUTPUT_TOKENS for p in peer), [p.output_tokens for p in peer]
    assert all(g.output_tokens == OUTPUT_TOKENS for _, g in pairs), [g.output_tokens for _, g in pairs]
    _check_agreement("guidellm", pairs, end="e2e")  # guidellm's E2E ends when the stream closes after [DONE]
