"""Capture: the bridge from finished requests to the trace writer thread (`traces.writer`).

The hot path only decides sampling and appends the record to the writer's bounded, lock-free deque
(`TraceWriter.submit`); the writer thread drains it every `DRAIN_S`, so neither the loop nor the thread
wakes per request, and the loop runs no timer while records flow. Canonical prompt bytes and prefix
hashing run in the writer thread.
Sampling keeps whole sessions: by a keyed digest of the session key here, or, for prefix-derived
sessions, in the writer thread once the session is known (`gateway.sessions`); requests without a
session by a seeded RNG. A full queue drops and counts the record; capture never delays a response
or logs prompt content.
Lost records (disk full, writer errors, full queue) log one warning per episode, with the path and
reason, and one line when writes succeed again; in between only the counters move.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from slogate.gateway.config import GatewayConfig
from slogate.gateway.sessions import SessionDeriver, keeps, key_of, parse_sources, sampled_in_writer
from slogate.traces.anonymize import PrefixHasher, SaltError, load_salt
from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.request_info import prompt_bytes
from slogate.traces.usage import UsageError
from slogate.traces.writer import TraceWriter, WriterConfig

DRAIN_S = 0.2  # the writer thread takes queued records this often (frames still go out every flush_interval)
WATCH_S = 1.0  # while records are being lost, look at the writer's counters this often
log = logging.getLogger("slogate.gateway")


class Capture:
    """Sampling + submission to one `TraceWriter`; `t` of a record counts from `start_ns`."""

    def __init__(self, cfg: GatewayConfig, *, start_ns: int, start_unix: float, config_digest: str,
                 prefix: str = "slogate") -> None:
        trace = cfg.trace
        assert trace.dir is not None
        try:
            salt = load_salt(trace.salt_file)
        except SaltError as exc:
            raise UsageError(f"gateway.trace.salt_file (--trace-salt-file): {exc}") from None
        hasher = PrefixHasher(salt)
        del salt
        self._hasher = hasher
        self.session_sources = parse_sources(trace.session_from)
        self.session_header = trace.session_header if "header" in self.session_sources else None
        # a session's keep-or-drop is a salted digest of (seed, session): without --trace-seed the seed is 0,
        # so every turn (and every worker, which share the salt) gives the same answer; the salt keeps it unguessable
        session_seed = trace.seed if trace.seed is not None else 0
        # prefix sessions are named by (run, the writer's count of them): with --workers N every worker (and
        # each restart of one) counts from 0 on the same start_unix, so its segment prefix is in the run id
        sessions = SessionDeriver(hasher, sources=self.session_sources, window_s=trace.session_window,
                                  run_id=f"{start_unix:.6f}/{prefix}", sample=trace.sample,
                                  seed=session_seed) if self.session_sources else None
        header = TraceHeader(
            start_unix=start_unix,
            slos=dict(cfg.slos),
            config_digest=config_digest,
            source="gateway",
        )
        self.writer = TraceWriter(
            WriterConfig(
                directory=trace.dir,
                flush_interval_s=trace.flush_interval,
                max_segment_bytes=trace.rotate_bytes,
                max_segment_age_s=trace.rotate_seconds,
                queue_size=trace.queue_size,
                drain_interval_s=DRAIN_S,  # the writer caps it at flush_interval
                prefix=prefix,  # unique per worker process with --workers N
            ),
            header,
            hasher=hasher,
            sessions=sessions,
        )
        self.sample = trace.sample
        self.keep_chunk_times = trace.chunk_times
        self._seed = session_seed
        self._rng = random.Random(trace.seed)
        self.start_ns = start_ns
        self.sampled_here = 0  # sampled out before the writer (keyed sessions, requests without a session)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch_handle: asyncio.TimerHandle | None = None
        self._seen = (0, 0)  # (written, lost) at the last look
        self._episode_lost = 0  # records lost since the current episode began (0: none running)

    def start(self) -> None:
        """Start the writer thread; called on the event loop (loss episodes are then watched on it)."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # no loop (tests, tools): submit straight to the writer
        self.writer.start()

    def submit(self, record: RequestRecord, body: Any, session_header: str | None = None) -> None:
        """Queue one finished record for the writer, with the decoded request body (for hashing) and
        the value of the `--session-header` header, if sent."""
        key = key_of(body, session_header, self.session_sources) if self.session_sources else None
        if self.sample < 1.0 and not self._sampled_in(record, body, key):
            self.sampled_here += 1
            return
        if not self.keep_chunk_times:
            record.chunk_times = None
        self._submit(record, body, key)
        if self._watch_handle is None and self._loop is not None:
            self._watch_handle = self._loop.call_later(WATCH_S, self._watch_timer)

    def _sampled_in(self, record: RequestRecord, body: Any, key: bytes | None) -> bool:
        """--trace-sample below 1: a keyed session by its key; a request that may continue a prefix
        session goes on (the writer decides once its session is known); any other by the RNG."""
        if key is not None:
            return keeps(self._hasher, self.sample, self._seed, key)
        if sampled_in_writer(self.session_sources, key, body, record.endpoint):
            return True
        return self._rng.random() < self.sample

    @property
    def sampled_out(self) -> int:
        """Records not written because of --trace-sample (here and in the writer thread)."""
        return self.sampled_here + self.writer.sampled_out

    def watch(self) -> None:
        """Log the start of a loss episode once (path, reason) and its end once; counters only between."""
        written, lost = self.counts()
        new_written, new_lost = written - self._seen[0], lost - self._seen[1]
        self._seen = (written, lost)
        if new_lost and not self._episode_lost:
            reason = self.writer.last_error if self.writer.errors else "the writer's queue is full"
            log.warning("trace records are being lost (%s; trace dir %s); counting them in "
                        "slogate_trace_records_total{outcome=\"dropped\"}, next log line when writes succeed again",
                        reason, self.writer.config.directory)
        if new_lost:
            self._episode_lost += new_lost
        elif new_written and self._episode_lost:
            log.warning("trace records are written again after %d were lost", self._episode_lost)
            self._episode_lost = 0

    def _watch_timer(self) -> None:
        self._watch_handle = None
        self.watch()
        if self._episode_lost and self._loop is not None:  # keep looking until the episode ends
            self._watch_handle = self._loop.call_later(WATCH_S, self._watch_timer)

    def _submit(self, record: RequestRecord, body: Any, key: bytes | None) -> None:
        self.writer.submit(record, prompt=(lambda: prompt_bytes(body)) if isinstance(body, dict) else None,
                           session_key=key)

    def counts(self) -> tuple[int, int]:
        """(written, dropped): dropped includes a full queue and records lost to disk errors."""
        return self.writer.written, self.writer.dropped + self.writer.lost

    def stop_watching(self) -> None:
        """On the event loop, at shutdown: stop the loss-episode timer and look at the counters once."""
        if self._watch_handle is not None:
            self._watch_handle.cancel()
        self._watch_handle = None
        self._loop = None
        self.watch()

    def close(self, timeout: float = 30.0) -> None:
        """Flush the last frame and join the writer thread (blocking: call `stop_watching` first)."""
        self.watch()
        self.writer.close(timeout)


def perf_epoch() -> tuple[int, float]:
    """A (perf_counter_ns, wall-clock) pair taken together: the trace's t = 0."""
    return time.perf_counter_ns(), time.time()
