"""The pacer on its own (no HTTP): a dense schedule (thousands per second, walked by the helper
thread) fires every item once, in order, never early, with its intended time; a cancel stops it;
`prepare` runs on the loop before `fire` for items due later than PREPARE_AHEAD_S."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
import uvloop

from slogate.replay.pacer import pace


def _run(coro):  # type: ignore[no-untyped-def]
    return uvloop.run(coro)


def test_dense_schedule_fires_every_item_in_order_on_time() -> None:
    times = [i / 10_000 for i in range(3_000)]  # 10,000/s for 0.3 s
    fired: list[tuple[int, int, int]] = []
    prepared: list[int] = []
    loop_thread: list[int] = []

    async def main() -> float:
        loop_thread.append(threading.get_ident())
        start = time.perf_counter() + 0.05

        def fire(i: int, intended_ns: int) -> None:
            assert threading.get_ident() == loop_thread[0]
            fired.append((i, intended_ns, time.perf_counter_ns()))

        await pace(list(range(len(times))), start, lambda i: times[i], fire, prepare=prepared.append)
        return start

    start = _run(main())
    assert [i for i, _, _ in fired] == list(range(len(times)))
    assert all(intended == round((start + times[i]) * 1e9) for i, intended, _ in fired)
    lags = sorted((actual - intended) / 1e9 for _, intended, actual in fired)
    assert lags[0] >= 0, lags[0]  # never early
    print(f"dense pacing lag p50 {lags[len(lags) // 2] * 1e3:.3f} ms, max {lags[-1] * 1e3:.1f} ms")
    assert lags[len(lags) // 2] < 0.005, lags[len(lags) // 2]
    assert 0 in prepared  # the first item was due 50 ms ahead: prepared before it fired


def test_dense_schedule_stops_when_cancelled() -> None:
    times = [i / 5_000 for i in range(50_000)]  # 10 s at 5,000/s: cancelled after 0.1 s
    fired: list[int] = []

    async def main() -> None:
        task = asyncio.create_task(pace(list(range(len(times))), time.perf_counter(), lambda i: times[i],
                                        lambda i, _ns: fired.append(i)))
        await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # its `finally` has halted the helper thread
        n = len(fired)
        await asyncio.sleep(0.05)
        assert len(fired) == n  # nothing fires after the cancel took effect
        assert 0 < n < len(times)

    _run(main())


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
def test_replay_at_1000_per_second_takes_the_dense_path_over_http() -> None:
    """A real sender at 1,000 req/s (dense: one helper thread walks its schedule) against the sim:
    every request sent once, on schedule, none failed. Three seconds of it, so that one scheduler stall
    of the shared 2-core box (tens of ms, seen in CI) cannot move the whole-run send rate past 2 %."""
    from slogate.replay.profiles import synthesize
    from slogate.replay.run import ReplayOptions, replay
    from tests.simserver import start_sim

    w = synthesize("constant:rate=1000", duration_s=3.0, input_tokens="fixed:8", output_tokens="fixed:2")
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim:
        out = replay(w, ReplayOptions(target=sim.url, endpoint="completions", workers=1, keep_chunk_times=False))
    s = out.results.summary
    assert s.requests == len(w.requests) and s.failed == 0
    assert sorted(round(r.t * 1000) for r in out.records) == list(range(len(w.requests)))
    assert s.send_rate_rps is not None and abs(s.send_rate_rps / 1000 - 1) < 0.02, s.send_rate_rps
    assert s.schedule_lag_s.p50 is not None and 0 <= s.schedule_lag_s.p50 < 0.005, s.schedule_lag_s


def test_a_failing_fire_is_raised_from_pace() -> None:
    def fire(i: int, _ns: int) -> None:
        if i == 5:
            raise ValueError("bug in fire")

    async def main() -> None:
        await pace(list(range(100)), time.perf_counter(), lambda i: i / 10_000, fire)

    try:
        _run(main())
    except ValueError as exc:
        assert "bug in fire" in str(exc)
    else:
        raise AssertionError("pace swallowed the failure of fire")
