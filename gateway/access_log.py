"""Access log: one JSON line per finished request (`--access-log PATH|-`), rotation-friendly.

`submit` only encodes the record's measured fields and appends the line to a buffer; a background
task writes the buffer every `interval` in a thread, and SIGHUP makes it reopen the file (logrotate's
`copytruncate` is not needed). Never writes prompt or completion text, headers, keys or client addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import IO

import orjson

from slogate.traces.record import RequestRecord, error_class
from slogate.traces.usage import UsageError

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

    def submit(self, record: RequestRecord, traceparent: str | None = None) -> None:
        self.buffer.append(access_line(record, self.start_unix))

    def reopen(self) -> None:
        """SIGHUP: the next write opens the path again (after logrotate moved the old file away)."""
        self._reopen = True

    def _open(self) -> IO[bytes]:
        if self.path == "-":
            return sys.stdout.buffer
        try:
            return open(self.path, "ab")
        except OSError as exc:
            raise UsageError(f"--access-log {self.path}: cannot open ({exc.strerror}); "
                             "give a writable file path or - for stdout") from None

    def _write(self, lines: list[bytes]) -> None:
        if self._reopen or self._file is None:
            self._reopen = False
            if self._file is not None and self.path != "-":
                self._file.close()
            self._file = self._open()
        self._file.write(b"".join(lines))
        self._file.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        if self.buffer or self._reopen:
            lines, self.buffer = self.buffer, []
            await asyncio.to_thread(self._write, lines)

    def start(self) -> None:
        self._file = self._open()  # fail at startup, not at the first request
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
        if self._file is not None and self.path != "-":
            self._file.close()
        self._file = None
