"""Trace writer: roundtrip, frames, rotation, drops on a full queue, real disk errors, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from slogate.traces.reader import SegmentReader, read_trace
from slogate.traces.record import ItlSummary, RequestRecord, TraceHeader
from slogate.traces.writer import TraceWriter, WriterConfig


def _records(n: int, start: int = 0) -> list[RequestRecord]:
    return [
        RequestRecord(t=i * 0.01, input_tokens=i, output_tokens=2 * i, ttft=0.1, e2e=1.5, status=200,
                      itl=ItlSummary(count=3, mean=0.02, p50=0.02, p99=0.03, max=0.03), hash_ids=[i, i + 1])
        for i in range(start, start + n)
    ]


def test_roundtrip_keeps_every_field_and_header(tmp_path) -> None:
    records = _records(500)
    header = TraceHeader(start_unix=1_700_000_000.25, slos={"default": "ttft=0.5"}, source="gateway")
    with TraceWriter(WriterConfig(directory=str(tmp_path)), header) as w:
        for r in records:
            assert w.submit(r)
    assert (w.written, w.dropped, w.lost, w.errors) == (500, 0, 0, 0)
    trace = read_trace(tmp_path)
    assert trace.records == _records(500)
    assert trace.header.start_unix == 1_700_000_000.25
    assert trace.header.slos == {"default": "ttft=0.5"}
    assert trace.header.segment == 0 and trace.skipped_bytes == 0


def test_records_arrive_out_of_order_and_are_read_in_arrival_order(tmp_path) -> None:
    with TraceWriter(WriterConfig(directory=str(tmp_path))) as w:
        for t in (3.0, 1.0, 2.0):
            w.submit(RequestRecord(t=t))
    assert [r.t for r in read_trace(tmp_path).records] == [1.0, 2.0, 3.0]


def test_each_flush_is_an_independent_frame(tmp_path) -> None:
    with TraceWriter(WriterConfig(directory=str(tmp_path), flush_interval_s=60)) as w:
        for batch in range(3):
            for r in _records(10, start=10 * batch):
                w.submit(r)
            assert w.flush()
            assert w.written == 10 * (batch + 1)
            # readable while the writer still has the file open
            assert len(SegmentReader(w.path).read()) == 10 * (batch + 1)


def test_flush_interval_writes_without_being_asked(tmp_path) -> None:
    with TraceWriter(WriterConfig(directory=str(tmp_path), flush_interval_s=0.05)) as w:
        w.submit(RequestRecord(t=0.0))
        deadline = time.monotonic() + 5
        while w.written == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.written == 1


def test_rotation_by_size_and_age(tmp_path) -> None:
    config = WriterConfig(directory=str(tmp_path / "size"), max_segment_bytes=300, flush_interval_s=60)
    with TraceWriter(config) as w:
        for batch in range(5):
            for r in _records(20, start=20 * batch):
                w.submit(r)
            w.flush()
    assert len(w.paths) >= 3
    assert w.paths == sorted(w.paths)
    headers = []
    for path in w.paths:
        reader = SegmentReader(path)
        reader.read()
        headers.append(reader.header)
    assert [h.segment for h in headers] == list(range(len(w.paths)))
    assert len({h.start_unix for h in headers}) == 1
    assert read_trace(tmp_path / "size").records == _records(100)

    with TraceWriter(WriterConfig(directory=str(tmp_path / "age"), max_segment_age_s=0.0)) as w:
        for i in range(3):
            w.submit(RequestRecord(t=float(i)))
            w.flush()
    assert len(w.paths) == 3


def test_full_queue_drops_and_counts_never_blocks(tmp_path) -> None:
    w = TraceWriter(WriterConfig(directory=str(tmp_path), queue_size=10))
    t0 = time.perf_counter()
    accepted = [w.submit(r) for r in _records(25)]  # thread not started: nothing drains the queue
    assert time.perf_counter() - t0 < 0.5
    assert accepted.count(True) == 10 and w.dropped == 15
    w.start()
    w.close()
    assert w.written == 10 and w.stats().dropped == 15
    assert not w.submit(RequestRecord(t=0.0)) and w.dropped == 16  # closed: dropped, not raised


def test_bad_prompt_callable_is_counted_not_fatal(tmp_path) -> None:
    from slogate.traces.anonymize import PrefixHasher

    def boom() -> bytes:
        raise RuntimeError("bad body")

    with TraceWriter(WriterConfig(directory=str(tmp_path)), hasher=PrefixHasher(b"k" * 32)) as w:
        w.submit(RequestRecord(t=0.0), prompt=boom)
        w.submit(RequestRecord(t=1.0), prompt=b"x" * 300)
    assert w.written == 2 and w.errors == 1
    records = read_trace(tmp_path).records
    assert records[0].hash_ids is None and len(records[1].hash_ids) == 2


def test_unwritable_directory_loses_counts_then_recovers(tmp_path) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("a file where the trace directory should be")  # real ENOTDIR/EEXIST, even as root
    config = WriterConfig(directory=str(blocker), retry_interval_s=0.05, flush_interval_s=60)
    with TraceWriter(config) as w:
        w.submit(RequestRecord(t=0.0))
        w.flush()
        assert (w.written, w.lost) == (0, 1) and w.errors >= 1 and "cannot create" in w.last_error
        blocker.unlink()
        time.sleep(0.1)
        w.submit(RequestRecord(t=1.0))
        w.flush()
    assert (w.written, w.lost) == (1, 1)
    assert [r.t for r in read_trace(blocker).records] == [1.0]


_SCRIPT = """
import os, random, resource, signal, sys, time
sys.path.insert(0, {root!r})
from slogate.traces.record import RequestRecord
from slogate.traces.writer import TraceWriter, WriterConfig
mode, directory = sys.argv[1], sys.argv[2]
if mode == "fsize":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
w = TraceWriter(WriterConfig(directory=directory, flush_interval_s=0.02, retry_interval_s=0.0)).start()
rng = random.Random(1)
i = 0
while True:
    w.submit(RequestRecord(t=i * 0.001, input_tokens=i, hash_ids=[rng.getrandbits(64) for _ in range(8)]))
    i += 1
    if i % 50 == 0:
        time.sleep(0.005)
        print(w.written, w.lost, w.errors, flush=True)
    if mode == "fsize" and i >= 2000:
        w.close()
        print("done", w.written, w.lost, w.errors, w.dropped, flush=True)
        break
"""


def _spawn(mode: str, directory: str) -> subprocess.Popen[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SCRIPT.format(root=root)), mode, directory],
                            stdout=subprocess.PIPE, text=True)


def test_kill_9_loses_at_most_the_last_flush(tmp_path) -> None:
    proc = _spawn("kill", str(tmp_path))
    written = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            written = int(line.split()[0])
            if written >= 400:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert written >= 400
    trace = read_trace(tmp_path)  # a cut last frame, if any, is skipped, not an error
    assert len(trace.records) >= written
    assert [r.input_tokens for r in trace.records] == list(range(len(trace.records)))


def test_file_size_limit_is_a_real_disk_error_that_never_raises(tmp_path) -> None:
    proc = _spawn("fsize", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    done = out.strip().splitlines()[-1].split()
    written, lost, errors = int(done[1]), int(done[2]), int(done[3])
    assert lost > 0 and errors > 0 and written > 0
    trace = read_trace(tmp_path)  # every segment readable: partial frames were cut off
    assert len(trace.records) == written and trace.skipped_bytes == 0
    assert all(p.stat().st_size <= 20000 for p in tmp_path.iterdir())
