"""The trace directory deleted while the gateway writes to it: the writer notices at its next frame
(the open segment's link count is 0), writes that frame again to a new segment in a recreated
directory and logs one warning per deletion naming the segment and the records that went with it;
every record sent after the deletion is on disk and the counters add up to the requests sent.
Idle, it closes the deleted segment at the next flush tick (its space is freed). A file put where
the directory was makes the frame's records lost (counted, one warning through the capture)."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import orjson
import pytest

from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from slogate.traces.writer import TraceWriter, WriterConfig
from tests.gateway.fixtures_gateway import SIM_MODEL, ChatSender, trace_counts, wait_for
from tests.realservers import start_gateway
from tests.simserver import start_sim

GONE = "was deleted while open"
LOST = "trace records are being lost"


def _record(i: int) -> RequestRecord:
    return RequestRecord(t=float(i), model="m", input_tokens=10, output_tokens=5,
                         ttft=0.01, e2e=0.1, status=200)


def _on_disk(directory: Path) -> list[RequestRecord]:
    return list(read_trace(directory).records)


@pytest.mark.timeout(90)
@pytest.mark.slow  # ~5 s: a real sim and gateway
def test_gateway_trace_dir_deleted_mid_run_starts_a_new_segment_and_warns_once(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    chat = orjson.dumps({"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    with start_sim(timing="constant", ttft_ms=1, itl_ms=1) as sim, start_gateway(
        sim.url, trace_dir=trace, extra_args=("--trace-flush-interval", "0.1"),
    ) as gw:
        send = ChatSender(gw.url, chat)

        def counts() -> tuple[float, float]:
            return trace_counts(gw.admin_url)

        send(3)
        assert wait_for(lambda: counts() == (3, 0), timeout=10), counts()
        shutil.rmtree(trace)  # the open segment is unlinked with its directory
        send(4)
        time.sleep(0.3)  # the next frames too
        send(3)
        assert wait_for(lambda: sum(counts()) == send.sent, timeout=10), (counts(), send.sent)
        assert wait_for(lambda: len(_on_disk(trace)) == 7 if trace.is_dir() else False, timeout=10)
        first_log = gw.log_text()

        shutil.rmtree(trace)  # a second episode: one more warning
        send(5)
        assert wait_for(lambda: sum(counts()) == send.sent, timeout=10), (counts(), send.sent)
        assert wait_for(lambda: len(_on_disk(trace)) == 5 if trace.is_dir() else False, timeout=10)
        written, dropped = counts()
        log = gw.log_text()
    assert (written, dropped) == (15, 0)  # every record was written; 3 + 7 went with the deleted segments
    gone = [line for line in first_log.splitlines() if GONE in line]
    assert len(gone) == 1 and "WARNING" in gone[0] and str(trace) in gone[0], first_log
    assert "3 records" in gone[0], gone[0]  # what went with the deleted segment is said
    assert log.count(GONE) == 2 and LOST not in log, log


def test_writer_rewrites_the_frame_to_a_new_segment_when_its_segment_was_deleted(tmp_path: Path, caplog) -> None:
    directory = tmp_path / "trace"
    config = WriterConfig(directory=str(directory), flush_interval_s=60)
    with caplog.at_level(logging.WARNING), TraceWriter(config) as w:
        for i in range(3):
            w.submit(_record(i))
        assert w.flush()
        first = w.path
        shutil.rmtree(directory)
        for i in range(3, 8):
            w.submit(_record(i))
        assert w.flush()
        assert w.path != first and w.path is not None and w.path.exists()
        assert [r.t for r in _on_disk(directory)] == [3.0, 4.0, 5.0, 6.0, 7.0]
        for i in range(8, 10):
            w.submit(_record(i))
        assert w.flush()
    assert (w.written, w.lost, w.dropped) == (10, 0, 0)
    assert [r.t for r in _on_disk(directory)] == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    warnings = [r.getMessage() for r in caplog.records if GONE in r.getMessage()]
    assert len(warnings) == 1 and str(first) in warnings[0] and "3 records" in warnings[0], warnings


def test_writer_closes_a_deleted_segment_while_idle(tmp_path: Path, caplog) -> None:
    directory = tmp_path / "trace"
    config = WriterConfig(directory=str(directory), flush_interval_s=0.05)
    with caplog.at_level(logging.WARNING), TraceWriter(config) as w:
        w.submit(_record(0))
        assert w.flush()
        shutil.rmtree(directory)
        assert wait_for(lambda: w._fd is None, timeout=5)  # closed at a flush tick without records
        assert sum(GONE in r.getMessage() for r in caplog.records) == 1
        w.submit(_record(1))
        assert w.flush()
        assert [r.t for r in _on_disk(directory)] == [1.0]
    assert (w.written, w.lost) == (2, 0)
    assert sum(GONE in r.getMessage() for r in caplog.records) == 1


def test_writer_counts_the_frame_lost_when_a_file_replaces_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "trace"
    config = WriterConfig(directory=str(directory), flush_interval_s=60, retry_interval_s=0.05)
    with TraceWriter(config) as w:
        w.submit(_record(0))
        assert w.flush()
        shutil.rmtree(directory)
        directory.write_text("a file where the trace directory was")
        for i in (1, 2):
            w.submit(_record(i))
        assert w.flush()
        assert (w.written, w.lost) == (1, 2)
        assert w.last_error is not None and GONE in w.last_error and "cannot create" in w.last_error, w.last_error
        directory.unlink()
        time.sleep(0.1)  # the retry interval
        w.submit(_record(3))
        assert w.flush()
    assert (w.written, w.lost) == (2, 2)
    assert [r.t for r in _on_disk(directory)] == [3.0]
