"""An access log that cannot be written (full disk, directory gone) costs its lines, never the gateway.

Before: the first failed write killed the writer task silently (lines piled up in memory from then on)
and re-raised at SIGTERM: a traceback and exit status 1. Now each episode logs one warning, the lines
are dropped, the path is opened again at the next write, and one line says when writing works again.
"""

from __future__ import annotations

import shutil
import signal

import orjson
import pytest

from tests.gateway.fixtures_gateway import SIM_MODEL, http_request, start_gateway, wait_for
from tests.simserver import start_sim

pytestmark = pytest.mark.timeout(60)

WARNING = "write failed"


def _chat(url: str) -> None:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert http_request(url, "POST", "/v1/chat/completions", orjson.dumps(body),
                        {"Content-Type": "application/json"})[0] == 200


def _stop(gw) -> str:  # type: ignore[no-untyped-def]
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=30) == 0, gw.log_text()
    return gw.log_text()


def test_full_disk_one_warning_and_a_clean_exit() -> None:
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            start_gateway(sim.url, "--access-log", "/dev/full") as gw:
        _chat(gw.url)
        assert wait_for(lambda: WARNING in gw.log_text())
        for _ in range(3):  # more failing flushes (every 0.2 s): still the one warning
            _chat(gw.url)
        text = _stop(gw)
    lines = text.splitlines()
    assert [line for line in lines if WARNING in line] == [
        next(line for line in lines if WARNING in line)], text
    assert "/dev/full" in text and "No space left on device" in text
    assert "Traceback" not in text and "stopped" in lines[-1], text


def test_directory_gone_then_back_writes_again(tmp_path) -> None:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    path = logdir / "access.jsonl"
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, \
            start_gateway(sim.url, "--access-log", str(path)) as gw:
        _chat(gw.url)
        assert wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") == 1)
        shutil.rmtree(logdir)
        gw.proc.send_signal(signal.SIGHUP)  # reopen: the directory is gone
        _chat(gw.url)
        assert wait_for(lambda: WARNING in gw.log_text()), gw.log_text()
        logdir.mkdir()
        _chat(gw.url)  # the next write opens the path again
        assert wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") >= 1), gw.log_text()
        assert wait_for(lambda: "writing again" in gw.log_text())
        text = _stop(gw)
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert rows and all(r["status"] == 200 and r["error"] is None for r in rows)
    assert text.count(WARNING) == 1 and "Traceback" not in text, text
