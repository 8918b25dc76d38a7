"""Access log: one JSON line per finished request (`--access-log PATH|-`), rotation-friendly.

`submit` only encodes the record's measured fields and appends the line to a buffer; a background
task writes the buffer every `interval` in a thread, and SIGHUP makes it reopen the file (logrotate's
`copytruncate` is not needed). A write that fails (full disk, directory gone) drops its lines: one warning
per episode, one line when writing works again; the gateway goes on. Never writes prompt or completion
text, headers, keys or client addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import IO

import orjson

from slogate.traces.record import RequestRecord, error_class
from slogate.traces.usage import UsageError

log = logging.getLogger("slogate.gateway")

# The record fields a line carries: measurements and routing only (never content).
FIELDS = ("endpoint", "model", "stream", "status", "finish_reason", "input_tokens", "output_tokens",
          "max_tokens", "cached_tokens", "ttft", "tpot", "e2e", "queue", "upstream", "pool")


def access_line(record: RequestRecord, start_unix: float) -> bytes:
    row: dict = {"ts": round(start_unix + record.t, 6)}
    for name in FIELDS:
        value = getattr(record, name)
        if value is not None:
            row[name] = round(value, 6) if isinstance(value, float) else value
    row["error"] = error_class(record)
    return orjson.dumps(row) + b"\n"


class AccessLog:
    """Buffered JSON-lines writer to a file (appended) or stdout (`-`)."""

    def __init__(self, path: str, start_unix: float, *, interval: float = 0.2) -> None:
        self.path = path
        self.start_unix = start_unix
        self.interval = interval
        self.buffer: list[bytes] = []
        self._file: IO[bytes] | None = None
        self._reopen = False
        self._task: asyncio.Task | None = None
        self.failing = False  # the last write failed: the episode's lines are counted in `lost`
        self.lost = 0

    def submit(self, record: RequestRecord, context: object = None) -> None:
        self.buffer.append(access_line(record, self.start_unix))

    def reopen(self) -> None:
        """SIGHUP: the next write opens the path again (after logrotate moved the old file away)."""
        self._reopen = True

    def _open(self) -> IO[bytes]:
        return sys.stdout.buffer if self.path == "-" else open(self.path, "ab")

    def _write(self, lines: list[bytes]) -> None:
        """Append `lines` (in the writer thread); on an error drop them and try again next time."""
        try:
            if self._reopen or self._file is None:
                self._reopen = False
                self._close_file()
                self._file = self._open()
            self._file.write(b"".join(lines))
            self._file.flush()
        except OSError as exc:
            self._failed(len(lines), exc)
            return
        if self.failing:
            log.info("access log %s: writing again; %d lines were lost", self.path, self.lost)
            self.failing, self.lost = False, 0

    def _failed(self, n_lines: int, exc: OSError) -> None:
        if not self.failing:
            log.warning("access log %s: write failed (%s); lines are dropped until a write succeeds",
                        self.path, exc.strerror or type(exc).__name__)
            self.failing = True
        self.lost += n_lines
        self._close_file()  # its unwritten bytes go with it; the next write opens the path again

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None and self.path != "-":
            with contextlib.suppress(OSError):
                file.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        if self.buffer or self._reopen:
            lines, self.buffer = self.buffer, []
            await asyncio.to_thread(self._write, lines)

    def start(self) -> None:
        try:
            self._file = self._open()  # fail at startup, not at the first request
        except OSError as exc:
            raise UsageError(f"--access-log {self.path}: cannot open ({exc.strerror}); "
                             "give a writable file path or - for stdout") from None
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
        self._close_file()
