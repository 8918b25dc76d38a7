"""A real `slogate gateway` whose trace directory is on a small, full tmpfs (mounted in a private
user+mount namespace by `unshare -rm`, so no root is needed): lost records log one warning with the
path and reason, then only the counter moves; freeing space logs one recovery line; a second
episode logs once again; only the counter moves meanwhile. The test reaches the gateway's mount through /proc/PID/root."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import read_trace
from tests.gateway.fixtures_gateway import SIM_MODEL, ChatSender, trace_counts, wait_for
from tests.realservers import start_gateway
from tests.simserver import start_sim

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]  # ~16 s: the writer retries a full disk after 5 s
LOST = "trace records are being lost"
AGAIN = "trace records are written again"
# mount a 64 KiB tmpfs on $FS, make the trace dir, fill the rest, then exec the gateway command
MOUNT = ('mount -t tmpfs -o size=64k tmpfs "$FS" && mkdir "$FS/trace" '
         '&& { head -c 1048576 /dev/zero > "$FS/filler" 2>/dev/null; true; } && exec "$@"')


def fill(path: Path) -> None:
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()


def test_disk_full_is_logged_once_per_episode_and_recovery_once(tmp_path: Path) -> None:
    assert shutil.which("unshare"), "unshare (Debian util-linux) is needed for this test"
    fs = tmp_path / "fs"
    fs.mkdir()
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, start_gateway(
        sim.url, trace_dir=fs / "trace", extra_args=("--trace-flush-interval", "0.1"),
        env={"FS": str(fs)}, wrapper=["unshare", "-rm", "sh", "-c", MOUNT, "sh"],
    ) as gw:
        inside = Path(f"/proc/{gw.proc.pid}/root") / str(fs).lstrip("/")  # the gateway's view of the tmpfs
        assert (inside / "filler").exists() and not any(fs.iterdir()), "the tmpfs is private to the gateway"

        send = ChatSender(gw.url, chat)

        def counts() -> tuple[float, float]:
            return trace_counts(gw.admin_url)

        send(30)
        assert wait_for(lambda: counts() == (0, 30), timeout=10), counts()
        assert wait_for(lambda: LOST in gw.log_text(), timeout=5)
        send(20)
        assert wait_for(lambda: counts() == (0, 50), timeout=10), counts()
        lines = [line for line in gw.log_text().splitlines() if LOST in line]
        assert len(lines) == 1 and "No space left on device" in lines[0] and str(fs / "trace") in lines[0], lines

        (inside / "filler").unlink()  # space again: the writer retries after its interval (5 s)
        assert wait_for(lambda: send(1) or counts()[0] > 0, timeout=20, interval=0.2), counts()
        assert wait_for(lambda: AGAIN in gw.log_text(), timeout=5)
        assert wait_for(lambda: sum(counts()) == send.sent, timeout=10), (counts(), send.sent)
        written, dropped = counts()
        send(10)
        assert wait_for(lambda: counts() == (written + 10, dropped), timeout=10), counts()

        fill(inside / "filler")  # a second episode (the segment's last page still takes a few frames)
        assert wait_for(lambda: send(5) or counts()[1] > dropped, timeout=20, interval=0.2), counts()
        assert wait_for(lambda: gw.log_text().count(LOST) == 2, timeout=5)
        send(10)
        assert wait_for(lambda: sum(counts()) == send.sent, timeout=10), (counts(), send.sent)
        written, dropped = counts()
        records = list(read_trace(inside / "trace").records)
        log = gw.log_text()
    assert log.count(LOST) == 2 and log.count(AGAIN) == 1, log
    assert len(records) == written  # every record counted as written is on the disk
