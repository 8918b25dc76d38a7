"""Live trace capture: a background thread that hashes, encodes, compresses and writes segments.

`submit()` never blocks and never raises: it appends the record to a bounded deque (no lock, no
thread wake-up per record: the writer drains it every `drain_interval_s`), and a full deque drops the
record and counts it (`dropped`). Prompt hashing, session hashing, JSON encoding and zstd
compression all happen in the writer thread, so the caller's hot path does none of it.

    writer = TraceWriter(WriterConfig(directory="traces/"), TraceHeader(source="gateway"), hasher=hasher)
    writer.start()
    writer.submit(record, prompt=lambda: prompt_bytes(body), session_key=user)  # from any thread
    writer.close()  # flushes the last frame and joins the thread

`prompt` is the prompt's bytes (byte blocks), its token ids (token blocks), or a zero-argument
function returning either, called in the writer thread; the writer sets `record.hash_ids` from it
(and `record.session` from `session_key`, or the session fields from the `sessions` hook), so after `submit` the record belongs to the writer.
Every `flush_interval_s` the pending lines become one independently decodable zstd frame, so a
crash (even kill -9) loses at most the last interval. Segments rotate by size and age; each new
segment starts with the header (its `segment` field = the sequence number in the file name).
Disk errors (ENOSPC, EACCES, EFBIG…) never reach the caller: the records of the failed frame are
counted in `lost`, the segment is closed, and a new one is tried after `retry_interval_s`.
A segment deleted while open (its directory removed) is noticed by one fstat after each frame (link
count 0): the frame is written again to a new segment in a recreated directory and one warning names
the deleted segment and how many records went with it; idle, the check runs every flush interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from slogate import __version__
from slogate.traces.anonymize import PrefixHasher, Prompt
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import COMPRESSION_LEVEL, compressor, encode_header, encode_records, segment_name

MAX_FRAME_BYTES = 4 << 20  # flush early when this much uncompressed data is pending
MAX_TAKEN_NAMES = 1000  # segment names already taken (another process's) skipped before giving up
log = logging.getLogger(__name__)


class WriterConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how a capture writes its segments."""

    directory: str
    prefix: str = "slogate"
    flush_interval_s: float = 1.0
    max_segment_bytes: int = 256 << 20  # compressed bytes per segment before rotating
    max_segment_age_s: float = 3600.0
    queue_size: int = 65536
    drain_interval_s: float = 0.05  # the writer thread wakes this often (or when a quarter of the queue is full)
    retry_interval_s: float = 5.0  # after a disk error, wait this long before opening a new segment
    compression_level: int = COMPRESSION_LEVEL
    fsync: bool = False  # fsync after every frame (survives power loss, not just process death)


class WriterStats(msgspec.Struct):
    """Counters for metrics: records written to disk, dropped on a full queue, lost to disk errors."""

    written: int
    dropped: int
    lost: int
    errors: int
    segments: int
    bytes_written: int
    queued: int
    last_error: str | None


_STOP = object()
_Item = tuple[RequestRecord, Prompt | None, "str | bytes | None"]
# Called in the writer thread after hashing with (record, prompt bytes or token ids or None, session key):
# sets the record's session fields (gateway.sessions) and returns False when the record's session is
# sampled out (not written, counted in `sampled_out`); without it a session key is simply hashed.
SessionHook = Callable[[RequestRecord, Any, "str | bytes | None"], "bool | None"]


class TraceWriter:
    """Writes `RequestRecord`s to rotating zstd JSON-lines segments from a background thread."""

    def __init__(self, config: WriterConfig, header: TraceHeader | None = None, *, hasher: PrefixHasher | None = None,
                 sessions: SessionHook | None = None):
        header = header or TraceHeader(source="gateway")
        changes: dict[str, object] = {"slogate_version": header.slogate_version or __version__}
        if header.start_unix == 0.0:
            changes["start_unix"] = time.time()
        if hasher is not None:
            changes.update(block_size=hasher.block_size, block_unit=hasher.block_unit, salt_id=hasher.salt_id)
        self.header: TraceHeader = msgspec.structs.replace(header, **changes)
        self.config = config
        self._hasher = hasher
        self._sessions = sessions
        # Records and control items (a flush's Event, _STOP). deque.append/popleft are atomic under the
        # GIL: the caller never takes a lock nor wakes the thread per record (a Queue's notify was ~4 %
        # of the gateway's CPU at saturation, and every wake-up took the GIL from the event loop).
        self._items: deque[object] = deque()
        self._wake = threading.Event()
        self._wake_at = max(1, config.queue_size // 4)
        self._thread = threading.Thread(target=self._run, name="slogate-trace-writer", daemon=True)
        self._closed = False
        self._cctx = compressor(config.compression_level)
        self._buf = bytearray()
        self._pending = 0
        self._fd: int | None = None
        self._seg_bytes = 0
        self._seg_records = 0  # records counted as written to the open segment
        self._seg_opened = 0.0
        self._seq = 0
        self._retry_at = 0.0
        self.path: Path | None = None  # current segment
        self.paths: list[Path] = []  # every segment opened, in order
        self.written = 0
        self.dropped = 0
        self.lost = 0
        self.errors = 0
        self.sampled_out = 0  # records the session hook sampled out (--trace-sample keeps whole sessions)
        self.bytes_written = 0
        self.last_error: str | None = None

    # -- caller side (any thread) ---------------------------------------------------------------

    def start(self) -> TraceWriter:
        self._thread.start()
        return self

    def submit(self, record: RequestRecord, *, prompt: Prompt | None = None, session_key: str | bytes | None = None) -> bool:
        """Queue one record; False (and `dropped` + 1) when the queue is full or the writer is closed."""
        items = self._items
        if self._closed or len(items) >= self.config.queue_size:
            self.dropped += 1
            return False
        items.append((record, prompt, session_key))
        if len(items) >= self._wake_at:
            self._wake.set()
        return True

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Write everything queued so far as a frame now (tests, shutdown hooks); True when done in time."""
        if self._closed or not self._thread.is_alive():
            return False
        done = threading.Event()
        self._items.append(done)
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop accepting records, write what is queued, close the segment and join the thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread.ident is None:  # never started: what was queued is dropped, and counted
            self.dropped += sum(1 for item in self._items if isinstance(item, tuple))
        elif self._thread.is_alive():
            self._items.append(_STOP)
            self._wake.set()
            self._thread.join(timeout)

    def stats(self) -> WriterStats:
        return WriterStats(
            written=self.written,
            dropped=self.dropped,
            lost=self.lost,
            errors=self.errors,
            segments=len(self.paths),
            bytes_written=self.bytes_written,
            queued=len(self._items),
            last_error=self.last_error,
        )

    def __enter__(self) -> TraceWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writer thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        interval = self.config.flush_interval_s
        drain = min(self.config.drain_interval_s, interval)
        items, wake = self._items, self._wake
        next_flush = time.monotonic() + interval
        stop = False
        while not stop:
            wake.wait(max(0.0, min(drain, next_flush - time.monotonic())))
            wake.clear()
            waiters: list[threading.Event] = []
            while items:
                item = items.popleft()
                if item is _STOP:
                    stop = True
                    break
                if isinstance(item, threading.Event):
                    waiters.append(item)
                    break
                self._add(item)  # type: ignore[arg-type]
                if len(self._buf) >= MAX_FRAME_BYTES:
                    break
            now = time.monotonic()
            if stop or waiters or now >= next_flush or len(self._buf) >= MAX_FRAME_BYTES:
                self._flush()
                next_flush = now + interval
            for event in waiters:
                event.set()
            if items and not stop:
                wake.set()  # stopped early (a waiter, a full frame): go on without sleeping
        self._close_segment()

    def _add(self, item: _Item) -> None:
        record, prompt, session_key = item
        if self._hasher is not None:
            data = None
            try:
                data = prompt() if callable(prompt) else prompt
                if data is not None:
                    record.hash_ids = self._hasher(data)
                if session_key is not None and self._sessions is None:
                    record.session = self._hasher.session(session_key)
            except Exception as exc:  # a bad prompt callable must not stop the capture
                self._error(f"hashing failed: {type(exc).__name__}")
            if self._sessions is not None:
                try:
                    if self._sessions(record, data, session_key) is False:
                        self.sampled_out += 1
                        return
                except Exception as exc:  # nor a session bug: the record is written without its session
                    self._error(f"session derivation failed: {type(exc).__name__}")
        try:
            encode_records((record,), self._buf)
        except Exception as exc:  # an unencodable record is lost, not fatal
            self._error(f"encoding failed: {type(exc).__name__}: {exc}")
            self.lost += 1
            return
        self._pending += 1

    def _flush(self) -> None:
        if not self._pending:
            if self._fd is not None and not self._linked():  # idle: give the deleted file's space back now
                self._forget_deleted()
            return
        count, data = self._pending, bytes(self._buf)
        self._buf.clear()
        self._pending = 0
        now = time.monotonic()
        if self._fd is not None and (
            self._seg_bytes >= self.config.max_segment_bytes or now - self._seg_opened >= self.config.max_segment_age_s
        ):
            self._close_segment()
        if self._fd is None and (now < self._retry_at or not self._open_segment()):
            self.lost += count
            return
        frame = self._cctx.compress(data)
        if self._write(frame) and (self._linked() or self._rewrite(frame)):
            self.written += count
            self._seg_records += count
            if self._seg_bytes >= self.config.max_segment_bytes:
                self._close_segment()
        else:
            self.lost += count

    def _open_segment(self) -> bool:
        directory = Path(self.config.directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._disk_error(f"cannot create {directory}: {exc.strerror or exc}")
            return False
        for _ in range(MAX_TAKEN_NAMES):
            seq = self._seq
            self._seq += 1
            path = directory / segment_name(self.config.prefix, seq)
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
                break
            except FileExistsError:  # another gateway on this directory, or a restart within the same second:
                continue  # never clobber its segment, take the next sequence number
            except OSError as exc:
                self._disk_error(f"cannot create {path}: {exc.strerror or exc}")
                return False
        else:
            self._disk_error(f"cannot create a segment in {directory}: {MAX_TAKEN_NAMES} names in a row "
                             f"(up to {path.name}) are taken; give each gateway its own --trace-dir")
            return False
        self.path, self._seg_bytes, self._seg_records, self._seg_opened = path, 0, 0, time.monotonic()
        header = msgspec.structs.replace(self.header, segment=seq)
        if not self._write(self._cctx.compress(encode_header(header))):
            _remove(path)
            return False
        self.paths.append(path)
        return True

    def _write(self, frame: bytes) -> bool:
        """Append one frame; on error cut the partial frame off, close the segment, schedule a retry."""
        assert self._fd is not None
        view, start = memoryview(frame), self._seg_bytes
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
                self._seg_bytes += n
            if self.config.fsync:
                os.fsync(self._fd)
        except OSError as exc:
            self._disk_error(f"cannot write {self.path}: {exc.strerror or exc}")
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            self._close_segment()
            return False
        self.bytes_written += len(frame)
        return True

    def _linked(self) -> bool:
        """False when the open segment's file has no name left (deleted, e.g. with its directory)."""
        assert self._fd is not None
        try:
            return os.fstat(self._fd).st_nlink > 0
        except OSError:  # not on an open descriptor; a real disk problem shows at the next write
            return True

    def _rewrite(self, frame: bytes) -> bool:
        """The frame just went to a deleted segment: write it again to a new one (the directory is
        recreated). False, with the deletion in `last_error`, when that fails: the frame is lost."""
        gone = self._forget_deleted(warn=False)
        if self._open_segment() and self._write(frame):
            log.warning("%s; writing to %s", gone, self.path)
            return True
        self.last_error = f"{gone}, then {self.last_error}"  # the capture's one loss warning says both
        return False

    def _forget_deleted(self, *, warn: bool = True) -> str:
        """Close the deleted segment; what went with it (logged unless `warn` is False)."""
        gone = (f"trace segment {self.path} was deleted while open (trace dir {self.config.directory} removed?): "
                f"the {self._seg_records} records written to it are gone (counted as written)")
        self._close_segment()
        if warn:
            log.warning("%s; the next records go to a new segment", gone)
        return gone

    def _close_segment(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError as exc:
                self._error(f"cannot close {self.path}: {exc.strerror or exc}")
            self._fd = None

    def _disk_error(self, message: str) -> None:
        self._error(message)
        self._retry_at = time.monotonic() + self.config.retry_interval_s

    def _error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
