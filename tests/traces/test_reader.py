"""Trace reader: a cut at any byte reads up to the cut; corruption is a TraceError naming file and offset.

Records read back equal the records written, field types included, and encode to the same bytes.
"""

from __future__ import annotations

import gc
import random
import struct

import pytest
import zstandard

from slogate.traces import reader as reader_module
from slogate.traces.reader import SegmentReader, read_trace
from slogate.traces.record import ItlSummary, RequestRecord, TraceHeader
from slogate.traces.segments import (
    ZSTD_MAGIC,
    TraceError,
    compressor,
    encode_header,
    encode_records,
    write_segment,
)


def _segment(path, n: int = 12, per_frame: int = 3, start_unix: float = 0.0) -> list[int]:
    """Write n records in frames of `per_frame`; return the byte offset where each frame ends."""
    records = [RequestRecord(t=float(i), input_tokens=i) for i in range(n)]
    write_segment(path, TraceHeader(start_unix=start_unix), records, frame_records=per_frame)
    data = path.read_bytes()
    ends, pos = [], 0
    while pos < len(data):
        dobj = zstandard.ZstdDecompressor().decompressobj()
        dobj.decompress(data[pos:])
        pos = len(data) - len(dobj.unused_data)
        ends.append(pos)
    return ends


def _decodable(data: bytes) -> bytes:
    """Everything zstandard decompresses from (cut) data fed at once, frame after frame."""
    out = bytearray()
    while data:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out += dobj.decompress(data)
        data = dobj.unused_data if dobj.eof else b""
    return bytes(out)


def _whole_lines(data: bytes) -> list[bytes]:
    return data[: data.rfind(b"\n") + 1].splitlines()


@pytest.mark.parametrize("read_chunk", [1 << 20, 7])  # 7 bytes: every frame spans many reads
def test_cut_at_every_byte_reads_up_to_the_cut(tmp_path, monkeypatch, read_chunk) -> None:
    """Every whole line zstd can decompress before the cut is read (a cut frame included); skipped_bytes is
    the file's tail that yields no line: all of it is needed, and one byte less loses a line."""
    monkeypatch.setattr(reader_module, "READ_CHUNK", read_chunk)
    full = tmp_path / "full.jsonl.zst"
    ends = _segment(full, n=12, per_frame=3)  # header frame + 4 record frames
    data = full.read_bytes()
    cut_path = tmp_path / "cut.jsonl.zst"
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        reader = SegmentReader(cut_path)
        records = reader.read()
        lines = _whole_lines(_decodable(data[:cut]))
        assert [r.input_tokens for r in records] == list(range(max(0, len(lines) - 1))), cut
        assert (reader.header is not None) == bool(lines), cut
        assert reader.cut == (cut not in ends and cut > 0), cut
        kept = cut - reader.skipped_bytes
        assert kept >= 0 and len(_whole_lines(_decodable(data[:kept]))) == len(lines), cut
        if reader.skipped_bytes and kept not in (0, *ends):  # inside the cut frame: one byte less loses a line
            assert len(_whole_lines(_decodable(data[: kept - 1]))) < len(lines), cut
        complete = len(_whole_lines(_decodable(data[: max((e for e in ends if e <= cut), default=0)])))
        assert reader.recovered == max(0, len(lines) - 1) - max(0, complete - 1), cut  # records of the cut frame


def test_cut_raw_block_keeps_its_whole_lines(tmp_path) -> None:
    """A stored (raw) zstd block is decompressed byte by byte: a cut one still gives its whole lines, and
    skipped_bytes counts from the byte after the last newline. (zstd stores a block raw when it does not
    compress: our small header frames; here a hand-made frame, no checksum, one raw block of 5 lines.)"""
    text = encode_header(TraceHeader(source="raw")) + bytes(encode_records(RequestRecord(t=float(i)) for i in range(4)))
    frame = ZSTD_MAGIC + b"\x00\x50" + ((len(text) << 3) | 1).to_bytes(3, "little") + text  # window 1 MiB; last raw block
    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) == text
    path = tmp_path / "raw.jsonl.zst"
    starts = [0, *(i + 1 for i, c in enumerate(text) if c == 10)]  # where each line starts in the text
    for cut in range(len(frame) + 1):
        path.write_bytes(frame[:cut])
        reader = SegmentReader(path)
        records = reader.read()
        whole = sum(1 for e in starts[1:] if 9 + e <= cut)  # lines whose newline is on disk
        assert len(records) == max(0, whole - 1) and reader.cut == (0 < cut < len(frame)), cut
        assert reader.skipped_bytes == (cut - 9 - starts[whole] if whole else cut) or cut == len(frame), cut


def test_one_frame_cut_keeps_every_whole_line(tmp_path) -> None:
    """A file written as one big frame (a replay's requests.jsonl.zst under 8192 records) cut anywhere keeps
    every record of its complete zstd blocks: not a record is lost to the cut frame beyond the partial one."""
    records = _gateway_like(3000)
    path = tmp_path / "one.jsonl.zst"
    write_segment(path, TraceHeader(source="replay"), records)  # header frame + one frame of 3000 records
    data = path.read_bytes()
    cut = tmp_path / "cut.jsonl.zst"
    for keep in (len(data) - 1, len(data) - 4, len(data) // 2, 200):
        cut.write_bytes(data[:keep])
        trace = read_trace(cut)
        expected = len(_whole_lines(_decodable(data[:keep]))) - 1
        assert trace.records == records[:expected] and trace.truncated == [str(cut)], keep
        assert trace.recovered == expected and trace.skipped_bytes < len(data) - 100, keep
    cut.write_bytes(data[:-1])  # only the checksum is cut: every record is there
    assert read_trace(cut).records == records
    cut.write_bytes(data[: len(data) // 2])
    assert len(read_trace(cut).records) > 1000  # the first half of the frame's blocks


def test_corrupt_middle_frame_names_file_and_offset(tmp_path) -> None:
    path = tmp_path / "bad.jsonl.zst"
    ends = _segment(path)
    data = bytearray(path.read_bytes())
    data[ends[1] + 12] ^= 0xFF  # inside the second record frame's data
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(path) in str(info.value) and f"at byte {ends[1]}" in str(info.value)


def test_not_a_trace_and_missing_header(tmp_path) -> None:
    junk = tmp_path / "junk.jsonl.zst"
    junk.write_bytes(b"\x00\x01garbage")
    with pytest.raises(TraceError, match="at byte 0"):
        read_trace(junk)
    headless = tmp_path / "headless.jsonl.zst"
    headless.write_bytes(zstandard.ZstdCompressor().compress(bytes(encode_records([RequestRecord(t=0.0)]))))
    with pytest.raises(TraceError, match="no header"):
        read_trace(headless)
    bad_line = tmp_path / "badline.jsonl.zst"
    bad_line.write_bytes(zstandard.ZstdCompressor().compress(encode_header(TraceHeader()) + b'{"t":"soon"}\n'))
    with pytest.raises(TraceError, match="line 1"):
        read_trace(bad_line)
    with pytest.raises(TraceError, match="cannot open"):
        read_trace(tmp_path / "missing.jsonl.zst")


def test_plain_json_lines_are_accepted(tmp_path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_bytes(encode_header(TraceHeader()) + bytes(encode_records([RequestRecord(t=1.0)])) + b'{"t":2')
    reader = SegmentReader(path)
    assert [r.t for r in reader.read()] == [1.0] and reader.skipped_bytes == 6


def test_segments_merge_in_arrival_order_and_captures_align_on_wall_clock(tmp_path) -> None:
    a, b = tmp_path / "a.jsonl.zst", tmp_path / "b.jsonl.zst"
    write_segment(a, TraceHeader(start_unix=1000.0), [RequestRecord(t=0.0), RequestRecord(t=5.0)])
    write_segment(b, TraceHeader(start_unix=1000.0, segment=1), [RequestRecord(t=2.0), RequestRecord(t=7.0)])
    assert [r.t for r in read_trace([a, b]).records] == [0.0, 2.0, 5.0, 7.0]
    c = tmp_path / "c.jsonl.zst"
    write_segment(c, TraceHeader(start_unix=1003.0), [RequestRecord(t=0.0)])  # another capture, 3 s later
    trace = read_trace([a, c])
    assert [r.t for r in trace.records] == [0.0, 3.0, 5.0] and trace.header.start_unix == 1000.0


def test_truncated_report_in_trace(tmp_path) -> None:
    path = tmp_path / "t.jsonl.zst"
    _segment(path)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    trace = read_trace(path)
    assert trace.truncated == [str(path)] and trace.skipped_bytes > 0 and len(trace.records) == 9


def test_corrupt_frame_start_names_its_offset(tmp_path) -> None:
    path = tmp_path / "bad.jsonl.zst"
    ends = _segment(path)
    for where, flip in ((ends[2], 0x01), (ends[2] + 4, 0x08)):  # frame magic; reserved header bit
        data = bytearray(path.read_bytes())
        data[where] ^= flip
        bad = tmp_path / f"bad{where}.jsonl.zst"
        bad.write_bytes(bytes(data))
        with pytest.raises(TraceError, match=f"at byte {ends[2]}: corrupt zstd frame"):
            read_trace(bad)


def test_frames_without_content_size_and_skippable_frames(tmp_path) -> None:
    """Files not made by our writer (`zstd` from a pipe, skippable frames) read as before."""
    records = [RequestRecord(t=float(i), input_tokens=i, hash_ids=[i, 1 << 63]) for i in range(5)]
    unsized = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False)
    stream = unsized.compressobj()
    piped = stream.compress(bytes(encode_records(records[2:4]))) + stream.flush()
    path = tmp_path / "mixed.jsonl.zst"
    path.write_bytes(
        unsized.compress(encode_header(TraceHeader(source="x")))
        + compressor().compress(bytes(encode_records(records[:2])))
        + struct.pack("<II", 0x184D2A50, 3) + b"abc"
        + piped
        + compressor().compress(bytes(encode_records(records[4:])))
    )
    reader = SegmentReader(path)
    assert reader.read() == records and reader.header == TraceHeader(source="x") and reader.skipped_bytes == 0


def _gateway_like(n: int) -> list[RequestRecord]:
    rng = random.Random(7)
    return [
        RequestRecord(
            t=i * 0.01, model="m", input_tokens=rng.randint(1, 9000), output_tokens=3, ttft=0.1, tpot=0.02,
            itl=ItlSummary(count=2, mean=0.02, p50=0.02, p99=0.03, max=0.03), chunk_times=[0.1, 0.12, 0.14],
            upstream="u1", hash_ids=[rng.getrandbits(64) for _ in range(rng.randint(0, 30))] or None,
        )
        for i in range(n)
    ]


def test_records_read_back_equal_and_encode_to_the_same_bytes(tmp_path) -> None:
    records = _gateway_like(300)
    path = tmp_path / "gw.jsonl.zst"
    write_segment(path, TraceHeader(source="gateway"), records, frame_records=64)
    trace = read_trace(path)
    assert trace.records == records
    assert all(type(r.hash_ids) is list for r in trace.records if r.hash_ids)  # lists, as the writer sets them
    assert all(type(r.chunk_times) is list for r in trace.records)
    again = tmp_path / "again.jsonl.zst"
    write_segment(again, trace.header, trace.records, frame_records=64)
    assert again.read_bytes() == path.read_bytes()


def test_read_leaves_the_garbage_collector_as_it_was(tmp_path) -> None:
    path = tmp_path / "gw.jsonl.zst"
    write_segment(path, TraceHeader(), _gateway_like(50))
    assert gc.isenabled()
    records = read_trace(path).records
    assert gc.isenabled() and not gc.is_tracked(records[0])  # records hold no cycles: never tracked
    gc.disable()
    try:
        read_trace(path)
        assert not gc.isenabled()
    finally:
        gc.enable()
    gc.freeze()  # a program that keeps objects frozen (e.g. before fork) keeps them frozen
    try:
        frozen = gc.get_freeze_count()
        read_trace(path)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_slogate_0_1_error_names_read_as_error_classes(tmp_path) -> None:
    """A trace written by slogate 0.1 (old error names, ints where floats go) reads with today's classes."""
    lines = [
        b'{"t":0,"status":502,"error":"upstream_connect","ttft":null}',
        b'{"t":1.5,"status":500,"error":"http_5xx","itl":{"count":1,"mean":0.1,"p50":0.1,"p99":0.1,"max":0.1}}',
        b'{"t":2.0,"error":"stream_error","finish_reason":"error"}',
        b'{"t":3.0,"output_tokens":7}',
        b'{"t":4.0,"status":429,"error":"queue_full"}',
    ]
    frame = encode_header(TraceHeader()) + b"\n".join(lines) + b"\n"
    path = tmp_path / "old.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(frame))
    records = read_trace(path).records
    assert [r.error for r in records] == ["connect", "upstream_status", "stream_error_event", None, "rejected"]
    assert records[1].itl == ItlSummary(count=1, mean=0.1, p50=0.1, p99=0.1, max=0.1) and records[0].t == 0.0
    assert records[3].output_tokens == 7
    plain = tmp_path / "old.jsonl"
    plain.write_bytes(frame)
    assert [r.error for r in SegmentReader(plain).read()] == [r.error for r in records]


def test_unknown_error_name_is_a_bad_record(tmp_path) -> None:
    path = tmp_path / "bad.jsonl.zst"
    body = encode_header(TraceHeader()) + b'{"t":0.0}\n{"t":1.0,"error":"bogus"}\n'
    path.write_bytes(zstandard.ZstdCompressor().compress(body))
    with pytest.raises(TraceError, match=r"line 2 .*bogus"):
        read_trace(path)
