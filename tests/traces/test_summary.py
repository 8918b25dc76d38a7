"""The one summary (traces/summary.py): tokens counted when produced, the offered window, drift, and
the status window agreeing with the run summary on random record sets (hypothesis)."""

from __future__ import annotations

import math
from time import perf_counter_ns

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate.gateway.status import StatusWindow
from slogate.traces.record import RequestRecord
from slogate.traces.slo import parse_slo
from slogate.traces.summary import Planned, Window, offered_window, output_tokens_in, summarize


def test_tokens_counted_when_produced():
    r = RequestRecord(t=10.0, ttft=1.0, e2e=11.0, output_tokens=11)  # first at 11 s, then 1 token/s to 21 s
    assert output_tokens_in(r, 0, 100) == pytest.approx(11)
    assert output_tokens_in(r, 0, 11.5) == pytest.approx(1 + 10 * 0.5 / 10)
    assert output_tokens_in(r, 16, 100) == pytest.approx(10 * 5 / 10)
    chunks = RequestRecord(t=0.0, ttft=1.0, e2e=3.0, output_tokens=6, chunk_times=[1.0, 2.0, 3.0])
    assert output_tokens_in(chunks, 0, 2.5) == pytest.approx(4)  # 2 of 3 chunks, 2 tokens each
    blocking = RequestRecord(t=0.0, e2e=2.0, output_tokens=5, stream=False)
    assert output_tokens_in(blocking, 0, 1.9) == 0 and output_tokens_in(blocking, 0, 2.1) == 5


def test_offered_window_is_n_gaps_long():
    records = [RequestRecord(t=float(i), e2e=50.0) for i in range(11)]  # 1 req/s, slow answers
    w = offered_window(records)
    assert (w.start, w.end) == (0.0, 11.0)
    s = summarize(records)
    assert s.duration_s == 11.0 and s.drain_requests == 11 and s.drain_s == pytest.approx(60 - 11)


def test_drift_is_token_weighted_with_counts_and_unreachable():
    recs = [RequestRecord(t=0.0, input_tokens=n, output_tokens=10, e2e=1.0) for n in (7, 100, 203)]
    plans = [Planned(2, 10), Planned(100, 10), Planned(200, 10)]
    s = summarize(recs, planned=plans, input_floor=7)
    assert s.unreachable_requests == 1  # a 2-token plan under a 7-token chat template: not drift
    assert s.input_token_drift == pytest.approx(3 / 300)
    assert s.input_drift_requests == 1 and s.input_drift_worst == pytest.approx(3 / 200)
    assert s.output_token_drift == 0 and s.output_drift_requests == 0


def test_failed_streams_count_in_throughput_never_in_goodput():
    good = RequestRecord(t=0.0, ttft=0.1, e2e=1.0, output_tokens=10, finish_reason="stop")
    cut = RequestRecord(t=0.5, ttft=0.1, e2e=1.0, output_tokens=10, error="reset")
    s = summarize([good, cut], window=Window(0, 10), slos=[parse_slo("ttft=1")])
    assert s.output_tokens_per_s == pytest.approx(2.0) and s.goodput_tokens_per_s == pytest.approx(1.0)
    assert s.failed == 1 and s.failed_by_class == {"reset": 1} and s.ttft_s.count == 1
    assert s.slo_attainment == 0.5


records_strategy = st.lists(
    st.builds(
        lambda t, ttft, dur, out, status, fin: RequestRecord(
            t=t, ttft=ttft, e2e=ttft + dur, output_tokens=out, status=status, finish_reason=fin,
            tpot=(dur / (out - 1)) if out and out > 1 else None),
        st.floats(0, 200), st.floats(0.001, 3), st.floats(0, 20), st.one_of(st.none(), st.integers(0, 500)),
        st.sampled_from([200, 200, 200, 429, 500]), st.sampled_from(["stop", "length", "abort", None]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(records_strategy)
def test_status_window_equals_the_run_summary(records):
    slos = [parse_slo("a:ttft=1,tpot=0.05"), parse_slo("b:e2e=5")]
    start = perf_counter_ns()
    w = StatusWindow(slos, start - 400 * 10**9)  # 400 s of uptime: the 5 m window is full
    now = w.now()
    for r in records:
        w.add(r)
    for row in w.rows:
        row.finished = now  # all finished "now": inside both windows
    snap = w.snapshot(now=now)["windows"]["5m"]
    s = summarize(records, window=Window(now - 300, now), slos=slos)
    assert snap["requests"] == s.requests == len(records)
    assert snap["errors"] == s.failed
    for key in ("ttft", "tpot", "e2e"):
        d = getattr(s, f"{key}_s")
        assert snap[key]["count"] == d.count
        for stat in ("p50", "p90", "p99"):
            a, b = snap[key][stat], getattr(d, stat)
            assert (a is None and b is None) or math.isclose(a, b)
    for slo in slos:
        g = s.goodput_by_slo[slo.name]
        assert snap["slos"][slo.name]["good_requests"] == g["good_requests"]
        if records:
            assert snap["slos"][slo.name]["attainment"] == pytest.approx(g["slo_attainment"])
    assert snap["output_tokens_per_s"] == pytest.approx(s.output_tokens_per_s)


def test_a_window_of_no_time_has_no_rates():
    """One request that failed at once (a connect error) spans no time: every rate is 0, not its count over
    the 1e-9 s that once stood in for zero (request_rate_rps 999,999,999.99)."""
    failed = RequestRecord(t=5.0, status=0, error="connect")
    s = summarize([failed], slos=[parse_slo("ttft=1")])
    assert s.duration_s == 0.0 and s.requests == 1 and s.failed == 1
    assert (s.request_rate_rps, s.output_tokens_per_s, s.total_tokens_per_s, s.samples_per_s) == (0.0, 0.0, 0.0, 0.0)
    assert (s.goodput_rps, s.goodput_tokens_per_s, s.slo_attainment) == (0.0, 0.0, 0.0)


def test_a_plan_shorter_than_the_template_is_unreachable_without_a_server_count():
    """llama.cpp streams no usage: a 3-token plan under a 9-token template was counted unreachable only
    when the server reported a count; the plan alone says it."""
    recs = [RequestRecord(t=0.0, e2e=1.0, ttft=0.5, output_tokens=2, input_tokens=None),
            RequestRecord(t=1.0, e2e=1.0, ttft=0.5, output_tokens=2, input_tokens=20)]
    s = summarize(recs, planned=[Planned(3, 2), Planned(20, 2)], input_floor=9)
    assert s.unreachable_requests == 1 and s.input_token_drift == 0.0 and s.input_drift_requests == 0
