"""One GIL switch interval for every slogate process: shortened to SWITCH_INTERVAL_S, never lengthened."""

from __future__ import annotations

import sys

from slogate.traces.runtime import SWITCH_INTERVAL_S, shorten_switch_interval


def test_shortens_but_never_lengthens() -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        shorten_switch_interval()
        assert abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 5e-6
        sys.setswitchinterval(0.0002)
        shorten_switch_interval()
        assert abs(sys.getswitchinterval() - 0.0002) < 5e-6
    finally:
        sys.setswitchinterval(before)
