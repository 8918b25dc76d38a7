"""The soak (tests/bench/soak.py): its verdict catches growth and lost records, and a short soak of a
real gateway in front of a faulty sim passes (slow: ~80 s). The hour-long run is in tests/bench/README.md."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.servers import REPO

SOAK = REPO / "tests" / "bench" / "soak.py"


def _soak_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("slogate_bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_verdict_catches_growth_and_loss() -> None:
    soak = _soak_module()

    def samples(rss: list[float], fds: list[int]) -> list:
        return [soak.Sample(minute=i, rss_mib=r, fds=f, loop_lag_ms=0.1, healthz_max_ms=1.0, written=10 * i,
                            dropped=0, sent=10 * i) for i, (r, f) in enumerate(zip(rss, fds, strict=True))]

    flat = samples([80, 50, 51, 50, 52, 51, 50, 52, 51, 50], [40, 30, 31, 30, 33, 29, 30, 31, 30, 32])
    assert soak.verdict(flat, written_final=90, sent=90, dropped_final=0) == []  # a warm-up spike is fine
    leaking = samples([50 + 4 * i for i in range(10)], [30] * 10)
    assert any("RSS grew" in p for p in soak.verdict(leaking, 90, 90, 0))
    fd_leak = samples([50] * 10, [30 + 5 * i for i in range(10)])
    assert any("open fds grew" in p for p in soak.verdict(fd_leak, 90, 90, 0))
    assert soak.verdict(flat, 89, 90, 0) == ["90 requests sent, 89 records in the trace"]
    assert soak.verdict(flat, 90, 90, 3) == ["3 records dropped"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_soak_is_flat_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SOAK), "--minutes", "0.75", "--sample-s", "5", "--rate", "10", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = orjson.loads(out.read_bytes())
    assert result["problems"] == [] and result["exit_code"] == 0
    assert result["records"] == result["sent"] > 300 and len(result["samples"]) >= 6
    assert set(result["by_kind"]) >= {"good", "reset", "error", "stall", "slow_reader", "hang_up"}
