"""Capture → replay round trip of sessions: a real gateway in front of the sim captures three
multi-turn conversations (one keyed by `--session-header`, one by the `user` field, one by prefix
continuation only), and `slogate replay` of that capture gives back the same sessions, turns, order
and think times, with the prompts' prefix sharing intact."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import orjson
import pytest

from slogate.replay.cli.replay import build_workload, parser
from slogate.replay.run import ReplayOptions, replay
from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from slogate.traces.stats import block_tokens, trace_stats
from tests.realservers import start_gateway
from tests.replay.conftest import reference_pacer
from tests.simserver import start_sim

SYSTEM = "You are a coding agent. Follow the repository's style guide and explain each change. " * 24
HEADER = "X-Session-Id"
# (how the session is named, its think times between turns)
CONVERSATIONS = {
    "header": (0.15, 0.30, 0.10),
    "user": (0.20, 0.10),
    "prefix": (0.25, 0.05, 0.12),
}
SIM = "sim:h100-sxm/llama-3-8b"


async def _conversation(http: aiohttp.ClientSession, url: str, kind: str, thinks: tuple[float, ...]) -> list[float]:
    """Send the turns of one conversation, each the whole conversation so far, `think` s after the previous
    answer's last byte; returns the client-side gaps (answer end → next send)."""
    messages = [{"role": "system", "content": SYSTEM}]
    gaps: list[float] = []
    ended = None
    for k in range(len(thinks) + 1):
        messages.append({"role": "user", "content": f"[{kind}] step {k}: " + f"please refactor module {k}. " * 6})
        body: dict = {"model": "llama-3-8b", "messages": messages, "stream": True, "max_tokens": 12}
        headers = {HEADER: f"conv-{kind}"} if kind == "header" else {}
        if kind == "user":
            body["user"] = "user-bob"
        if ended is not None:
            await asyncio.sleep(max(0.0, ended + thinks[k - 1] - time.perf_counter()))
            gaps.append(time.perf_counter() - ended)
        answer = []
        async with http.post(url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    for choice in orjson.loads(line[6:]).get("choices", []):
                        answer.append((choice.get("delta") or {}).get("content") or "")
        ended = time.perf_counter()
        messages.append({"role": "assistant", "content": "".join(answer)})
    return gaps


async def _drive(url: str) -> dict[str, list[float]]:
    async with aiohttp.ClientSession() as http:
        gaps = await asyncio.gather(*(_conversation(http, url, kind, thinks) for kind, thinks in CONVERSATIONS.items()))
    return dict(zip(CONVERSATIONS, gaps, strict=True))


def _workload(path: Path):
    """The workload `slogate replay CAPTURE` builds: session timing (think) is its default for sessions."""
    workload = build_workload(parser().parse_args([str(path), "--target", SIM]))[0]
    assert any(d.startswith("sessions=think") for d in workload.description)
    return workload


def _by_session(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    by: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by[r.session].append(r)
    for turns in by.values():
        turns.sort(key=lambda r: r.turn)
    return dict(by)


def _shape(records: list[RequestRecord]) -> list[list[tuple[int, float | None]]]:
    """Sessions (sorted by their turn count, then first arrival) as (turn, think) lists."""
    sessions = sorted(_by_session(records).values(), key=lambda t: (len(t), t[0].t))
    return [[(r.turn, r.think) for r in turns] for turns in sessions]


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> tuple[Path, dict[str, list[float]]]:
    out = tmp_path_factory.mktemp("capture")
    with start_sim(timing="constant", ttft_ms=20, itl_ms=2) as sim, \
            start_gateway(sim.url, trace_dir=out, extra_args=["--session-header", HEADER,
                                                               "--trace-flush-interval", "0.1"]) as gw:
        gaps = asyncio.run(_drive(gw.url))
    return out, gaps  # the gateway has stopped: every segment is closed


def test_gateway_capture_has_the_sessions_turns_and_think_times(capture) -> None:
    path, client_gaps = capture
    records = read_trace(path).records
    assert len(records) == sum(len(t) + 1 for t in CONVERSATIONS.values())
    by = _by_session(records)
    assert len(by) == 3 and all(r.session and r.parent_session is None for r in records)
    for turns in by.values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        assert all(turns[k].t > turns[k - 1].t for k in range(1, len(turns)))
        assert turns[0].think is None
    captured = {len(t): [r.think for r in t[1:]] for t in by.values()}
    measured = {len(g) + 1: g for g in client_gaps.values()}
    assert set(captured) == set(measured) == {3, 4}
    # the "header" and "prefix" conversations both have 4 turns: compare as a multiset per turn count.
    # The gateway sees an answer end before the client does and a request arrive after it was sent
    # (one monotonic clock), so its think time is the client's plus the two hops: never less.
    for n in (3, 4):
        expected = sorted(g for gaps in client_gaps.values() if len(gaps) + 1 == n for g in gaps)
        got = sorted(th for t in by.values() if len(t) == n for th in (r.think for r in t[1:]))
        diffs = [a - b for a, b in zip(got, expected, strict=True)]
        assert len(got) == len(expected) and all(-0.001 < d < 0.015 for d in diffs), diffs
    raw = b"".join(p.read_bytes() for p in sorted(path.iterdir()))
    assert b"conv-header" not in raw and b"user-bob" not in raw


def test_virtual_replay_of_the_capture_keeps_sessions_think_times_and_prefix_sharing(capture) -> None:
    path, _ = capture
    captured = read_trace(path).records
    out = replay(_workload(path), ReplayOptions(target=SIM, virtual=True))
    assert _shape(out.records) == _shape(captured)
    for turns in _by_session(out.records).values():
        for k in range(1, len(turns)):
            prev, r = turns[k - 1], turns[k]
            assert r.t - (prev.t + prev.e2e) == pytest.approx(r.think, abs=1e-6)
    s = out.results.sessions
    assert s is not None and (s.sessions, s.turns) == (3, len(captured))
    # the ideal in the blocks the replay builds: 256-byte capture blocks are 64-token blocks, and the
    # tokens after a prompt's last matching full block are new (vLLM's hit: matched full blocks × size)
    ideal = trace_stats(captured, block_tokens=block_tokens(read_trace(path).header)).ideal_prefix_reuse
    hit = out.results.prefix_cache_hit_rate
    assert ideal is not None and ideal > 0.5 and hit is not None
    print(f"prefix reuse: ideal {ideal:.3f}, sim hit rate {hit:.3f}")
    assert abs(hit - ideal) < 0.02, (hit, ideal)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_http_replay_of_the_capture_sends_each_turn_think_after_the_answer(capture) -> None:
    path, _ = capture
    captured = read_trace(path).records
    with start_sim(timing="constant", ttft_ms=30, itl_ms=3) as sim:
        start_at = time.time() + 1.0
        # a bare pacer process over the same second measures this shared machine's stalls meanwhile
        with reference_pacer([k * 0.01 for k in range(100)], start_at) as ref:
            out = replay(_workload(path), ReplayOptions(target=sim.url, tokenizer="none", start_at=start_at))
    assert _shape(out.records) == _shape(captured)
    gaps = [r.t - (prev.t + prev.e2e) - r.think for turns in _by_session(out.records).values()
            for prev, r in itertools.pairwise(turns)]
    bound = max(0.005, ref.max + 0.002)  # 5 ms, unless other jobs stalled even a bare pacer longer
    assert len(gaps) == len(captured) - 3 and max(abs(g) for g in gaps) < bound, (gaps, ref.max)


def test_a_capture_of_one_shot_requests_replays_open_loop(tmp_path) -> None:
    """Every captured request has a session (prefix derivation names one-turn sessions too); without a
    second turn or a subagent anywhere the trace is not session-timed, so --concurrency still works."""
    from slogate.traces.record import TraceHeader
    from slogate.traces.segments import write_segment

    path = tmp_path / "oneshot.jsonl.zst"
    write_segment(path, TraceHeader(source="gateway"), [
        RequestRecord(t=0.1 * i, input_tokens=50, output_tokens=5, e2e=0.05, session=f"p-{i:016x}", turn=0)
        for i in range(5)])
    workload = build_workload(parser().parse_args([str(path), "--target", SIM, "--concurrency", "2"]))[0]
    assert not any(d.startswith("sessions=") for d in workload.description)
    assert workload.concurrency == 2 and len(workload.requests) == 5


def _sessions_of(records: list[RequestRecord]) -> list[list[RequestRecord]]:
    """Sessions sorted as `_shape` sorts them (turn count, then first arrival)."""
    return sorted(_by_session(records).values(), key=lambda t: (len(t), t[0].t))


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_a_replay_captured_by_a_second_gateway_gives_the_sessions_back(capture, tmp_path) -> None:
    """replay → gateway (--session-header X-Session-Id) → sim: replay sends each session's opaque id in
    X-Session-Id (its default), so the second capture has the same sessions, turns and think times (±5 ms)."""
    path, _ = capture
    captured = read_trace(path).records
    again = tmp_path / "again"
    with start_sim(timing="constant", ttft_ms=20, itl_ms=2) as sim, \
            start_gateway(sim.url, trace_dir=again, extra_args=["--session-header", "X-Session-Id",
                                                                 "--session-from", "header",
                                                                 "--trace-flush-interval", "0.1"]) as gw:
        start_at = time.time() + 1.0
        # the bare pacer ticks every 10 ms over the whole replay (its span plus 1 s), not just its start
        span = max(r.t + (r.e2e or 0.0) for r in captured) - min(r.t for r in captured) + 1.0
        with reference_pacer([k * 0.01 for k in range(int(span * 100) + 1)], start_at) as ref:
            out = replay(_workload(path), ReplayOptions(target=gw.url, tokenizer="none", start_at=start_at))
    assert out.results.summary.failed == 0
    recaptured = read_trace(again).records
    assert _shape_turns(recaptured) == _shape_turns(captured)
    assert not {r.session for r in recaptured} & {r.session for r in captured}  # a new run: new session ids
    bound = max(0.005, ref.max + 0.002)  # 5 ms, unless other jobs stalled even a bare pacer longer
    diffs, hops = [], []
    replayed = _by_session(out.records)  # the replay's records carry the trace's session ids
    for s1, s2 in _pair(_sessions_of(captured), _sessions_of(recaptured)):
        s3 = replayed[s1[0].session]
        for k in range(1, len(s1)):
            sent_gap = s3[k].t - (s3[k - 1].t + s3[k - 1].e2e)  # the gap the replay actually left
            diffs.append(s2[k].think - s1[k].think)
            hops.append(s2[k].think - sent_gap)  # what the second gateway adds: the two hops
    print(f"think time, recaptured − captured: max {max(diffs) * 1e3:.2f} ms, min {min(diffs) * 1e3:.2f} ms; "
          f"hops max {max(hops) * 1e3:.2f} ms (pacer stall {ref.max * 1e3:.2f} ms)")
    assert len(diffs) == len(captured) - 3 and max(abs(h) for h in hops) < bound, (hops, ref.max)
    # the replay's own send error is bounded by the same stalls (test_http_replay_… checks it alone)
    assert max(abs(d) for d in diffs) < 2 * bound, (diffs, ref.max)


def _pair(a: list[list[RequestRecord]], b: list[list[RequestRecord]]) -> list[tuple[list, list]]:
    """Sessions of two captures paired by turn count and closest think times (the new capture names
    them anew; the conversations' think times differ by ≥ 50 ms, their start times by less than 1 ms)."""
    left, out = list(b), []
    for s in a:
        best = min((t for t in left if len(t) == len(s)),
                   key=lambda t: max(abs(x.think - y.think) for x, y in zip(s[1:], t[1:], strict=True)))
        left.remove(best)
        out.append((s, best))
    return out


def _shape_turns(records: list[RequestRecord]) -> list[list[int]]:
    return [[r.turn for r in turns] for turns in _sessions_of(records)]
