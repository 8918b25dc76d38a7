"""SLO parsing, the definition of a good request, TPOT and percentile summaries."""

from __future__ import annotations

import numpy as np  # ships with matplotlib (test extra)
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate.traces.metrics import percentile, summarize, tpot
from slogate.traces.record import RequestRecord
from slogate.traces.slo import SloError, is_good, parse_duration, parse_slo


def test_parse_slo_units_and_name():
    slo = parse_slo("interactive:ttft=0.5,tpot=50ms,e2e=30")
    assert (slo.name, slo.ttft, slo.tpot, slo.e2e) == ("interactive", 0.5, pytest.approx(0.05), 30.0)
    assert parse_slo("ttft=200ms").name == "default"
    assert parse_duration("2s") == 2.0


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [("ttft=abc", "'abc'"), ("latency=1", "unknown SLO key 'latency'"), ("ttft", "KEY=VALUE"), ("", "empty SLO"),
     ("ttft=0", "positive"), ("bad name:ttft=1", "bad SLO name")],
)
def test_parse_slo_errors_name_the_bad_part(spec, fragment):
    with pytest.raises(SloError, match=fragment.replace("(", r"\(")):
        parse_slo(spec)


def test_good_requires_success_and_every_bound():
    slo = parse_slo("ttft=0.5,tpot=0.05")
    ok = RequestRecord(t=0, ttft=0.4, tpot=0.04, e2e=2.0, output_tokens=10)
    assert is_good(ok, slo)
    assert not is_good(RequestRecord(t=0, ttft=0.6, tpot=0.04), slo)
    assert not is_good(RequestRecord(t=0, ttft=0.1, tpot=0.06), slo)
    assert not is_good(RequestRecord(t=0, ttft=0.1, status=429), slo)  # rejections are not good
    assert not is_good(RequestRecord(t=0, ttft=0.1, error="reset"), slo)
    assert not is_good(RequestRecord(t=0, ttft=0.1, finish_reason="abort"), slo)
    # an undefined metric (1-token answer has no TPOT) is not held against the request
    assert is_good(RequestRecord(t=0, ttft=0.1, tpot=None, output_tokens=1), slo)


def test_tpot_definition():
    assert tpot(2.0, 0.5, 31) == pytest.approx(0.05)
    assert tpot(2.0, 0.5, 1) is None
    assert tpot(None, 0.5, 10) is None


@settings(deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_percentiles_match_numpy_linear(values):
    data = sorted(values)
    for q in (0, 50, 90, 99, 99.9, 100):
        assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)), rel=1e-9, abs=1e-9)
    s = summarize(values)
    assert s.count == len(values) and s.max == max(values)
    assert s.mean == pytest.approx(sum(values) / len(values), rel=1e-9, abs=1e-9)


def test_summarize_ignores_nulls_and_empty():
    assert summarize([None, None]).count == 0
    assert summarize([1.0, None, 3.0]).p50 == 2.0
