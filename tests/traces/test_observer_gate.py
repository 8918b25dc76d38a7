"""The observer's one-regex gate decides exactly what its key-by-key scans decide (fuzzed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate.traces.observer import _ERROR_WORD, _FINISH_KEY, _TAIL_GATE, _USAGE_KEY, _value_at

PARTS = [b'"error"', b'"finish_reason"', b'"usage"', b":", b" ", b"\t", b"\r\n", b'"', b"{", b"null", b"x", b",",
         b'"stop"', b'"object":"error"']


def slow(p: bytes) -> bool:
    return _ERROR_WORD in p or _value_at(p, _FINISH_KEY, 34) or _value_at(p, _USAGE_KEY, 123)


@pytest.mark.slow  # over ~2 s: outside the fast tier (-m "not slow")
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(PARTS), max_size=12))
def test_gate_matches_key_scans(parts):
    payload = b"".join(parts)
    assert (_TAIL_GATE(payload) is not None) == slow(payload)


def test_gate_examples():
    assert _TAIL_GATE(b'{"choices":[{"text":"a","finish_reason":"length"}]}')
    assert _TAIL_GATE(b'{"choices":[],"usage" : {"completion_tokens":3}}')
    assert not _TAIL_GATE(b'{"choices":[{"text":"a","finish_reason":null}],"usage":null}')
