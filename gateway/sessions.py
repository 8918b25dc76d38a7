"""Session derivation at capture: which session, turn, parent and think time a finished request has.

Runs in the trace writer thread (`traces.writer`, after prefix hashing), in completion order. A
session comes from a key (the `--session-header` value, else the OpenAI `user` field), or from
prefix continuation: a prompt that starts with an earlier request's whole prompt, sent after that
request ended and within the window, is its next turn (a fork of an older turn is a child session).
`--trace-sample` below 1 keeps or drops whole sessions (`keeps`: a keyed digest of the session key,
or of a prefix session's ordinal; subagents follow their parent). Keeps only keyed digests and
lengths in memory; never stores, logs or returns prompt bytes or keys.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections import deque
from collections.abc import Sequence

import msgspec

from slogate.traces.anonymize import PrefixHasher
from slogate.traces.record import RequestRecord, is_error
from slogate.traces.session_merge import PREFIX_ID  # "p-<hash>": `slogate trace merge` may join these

SOURCES = ("header", "user", "prefix")
DEFAULT_WINDOW_S = 600.0
MAX_ENTRIES = 200_000  # prompts remembered for prefix continuation (oldest forgotten first)
MAX_BUCKET = 64  # prompts remembered per identical block prefix (many clients sending one prompt)
LATE_S = 1e-3  # a continuation may arrive this much before the earlier request's recorded end
_ROOT = -1  # bucket of prompts shorter than one block
_NO_SESSION_ENDPOINTS = ("/v1/embeddings",)


def parse_sources(text: str) -> tuple[str, ...]:
    """'header,user,prefix' (any subset, in order of precedence) or 'off' → the sources."""
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    if items == ("off",):
        return ()
    bad = [s for s in items if s not in SOURCES]
    if bad or not items:
        raise ValueError(f"bad session source {','.join(bad) or text!r}: use a list of header, user, prefix, or off")
    return items


def keeps(hasher: PrefixHasher, fraction: float, seed: int, name: bytes) -> bool:
    """Whether the session `name` (a raw key, or a prefix session's ordinal) is captured under
    `--trace-sample fraction`: a salted digest of the seed and the name below the fraction, so every
    turn of a session gets the same answer and nobody without the salt can steer it."""
    if fraction >= 1.0:
        return True
    return int(hasher.session(b"sample\0%d\0" % seed + name), 16) < fraction * 2.0**64


def sampled_in_writer(sources: Sequence[str], key: bytes | None, body: object, endpoint: str | None) -> bool:
    """A request whose sampling waits for prefix derivation in the writer thread (no key, prefix
    continuation on, a prompt to derive from): its session is known only there."""
    return key is None and "prefix" in sources and isinstance(body, dict) and endpoint not in _NO_SESSION_ENDPOINTS


def key_of(body: object, header_value: str | None, sources: Sequence[str]) -> bytes | None:
    """The raw session key of one request (hashed by the deriver, never stored): the header value
    when the header source is on and the client sent it, else the `user` field."""
    if "header" in sources and header_value:
        return b"h\0" + header_value.encode("utf-8", "surrogatepass")
    if "user" in sources and isinstance(body, dict):
        user = body.get("user")
        if isinstance(user, str) and user:
            return b"u\0" + user.encode("utf-8", "surrogatepass")
    return None


class _Session(msgspec.Struct, gc=False, eq=False):
    id: str
    turn: int  # the latest turn's number
    end: float  # the latest turn's completion (trace time)
    failed: bool  # the latest turn failed (a retry of it continues the session)
    prev_end: float | None = None  # the completion of the turn before the latest
    keep: bool = True  # --trace-sample: this session (and its subagents) is written


class _Prompt(msgspec.Struct, gc=False, eq=False):
    """One remembered prompt: its length, keyed digest of its tail (the bytes after the last full
    block) and the session turn it was."""

    length: int
    tail_len: int
    tail: int
    bucket: int
    session: _Session
    turn: int
    end: float


class SessionDeriver:
    """Assigns `session`, `turn`, `parent_session` and `think` to records, one at a time (not thread-safe:
    the writer thread is its only caller). With `sample` below 1 it also says which records of
    prefix-derived sessions are written (keyed sessions were sampled by their key before)."""

    def __init__(self, hasher: PrefixHasher, *, sources: Sequence[str] = SOURCES, window_s: float = DEFAULT_WINDOW_S,
                 run_id: str = "", max_entries: int = MAX_ENTRIES, sample: float = 1.0, seed: int = 0) -> None:
        self._hasher = hasher
        self.sample, self.seed = sample, seed
        self._rng = random.Random(seed)
        self.sources = tuple(sources)
        self.window_s = window_s
        self._run = run_id
        self._max = max_entries
        self._keyed: dict[bytes, _Session] = {}
        self._buckets: dict[int, list[_Prompt]] = {}
        self._order: deque[_Prompt] = deque()
        self._ids = itertools.count()

    def __call__(self, record: RequestRecord, prompt: object, key: bytes | str | None) -> bool:
        """Writer hook: `prompt` is the request's canonical prompt bytes (or None), `key` its raw key.
        False: the record's session is sampled out (the caller does not write it)."""
        if record.endpoint in _NO_SESSION_ENDPOINTS:
            return True
        if isinstance(key, str):
            key = key.encode("utf-8", "surrogatepass")
        end = record.t + (record.e2e or 0.0)
        self._expire(record.t)
        data = prompt if isinstance(prompt, bytes | bytearray | memoryview) else None
        if key is not None:
            sess = self._keyed_turn(record, key, end)
        elif "prefix" in self.sources and data:
            sess = self._prefix_turn(record, data, end)
        else:  # no session after all (an empty prompt): sampled as one request
            return self.sample >= 1.0 or self._rng.random() < self.sample
        sess.turn, sess.end, sess.failed = record.turn or 0, end, is_error(record)
        if data and "prefix" in self.sources and record.hash_ids:
            self._remember(data, record.hash_ids, sess, end)
        return key is not None or sess.keep

    # -- keyed sessions -----------------------------------------------------------------------------

    def _keyed_turn(self, record: RequestRecord, key: bytes, end: float) -> _Session:
        sess = self._keyed.pop(key, None)  # re-inserted below: the dict's order is least recently used first
        if sess is None or record.t - sess.end > self.window_s:
            # the first session of a key is the key's hash (equal across gateways and captures); a key
            # back after a pause longer than the window starts a new one, named by when it started
            epoch = b"" if sess is None else b"\0%.3f" % record.t
            sess = _Session(id=self._hasher.session(key + epoch), turn=-1, end=end, failed=False)
        else:
            record.think = max(0.0, record.t - sess.end)
        self._keyed[key] = sess
        if len(self._keyed) > self._max:
            del self._keyed[next(iter(self._keyed))]
        record.session = sess.id
        record.turn = sess.turn + 1
        return sess

    # -- prefix continuation ------------------------------------------------------------------------

    def _prefix_turn(self, record: RequestRecord, data: bytes | bytearray | memoryview, end: float) -> _Session:
        found = self._match(data, record.hash_ids or [], record.t)
        if found is None:
            return self._new_session(record, end, parent=None)
        sess = found.session
        continues = found.turn == sess.turn or (sess.failed and found.turn == sess.turn - 1)
        if not continues:  # a branch from an older turn: a child session (an agent's subagent, a retry tree)
            record.think = max(0.0, record.t - found.end)
            return self._new_session(record, end, parent=sess)
        record.session = sess.id
        record.turn = sess.turn + 1
        record.think = max(0.0, record.t - sess.end)  # from the latest turn (a retry: from the failure)
        return sess

    def _new_session(self, record: RequestRecord, end: float, parent: _Session | None) -> _Session:
        ordinal = next(self._ids)
        name = PREFIX_ID + self._hasher.session(f"prefix\0{self._run}\0{ordinal}")
        # sampled by the ordinal, not the name: the same seed keeps the same sessions in every capture
        keep = parent.keep if parent is not None else keeps(self._hasher, self.sample, self.seed, b"p\0%d" % ordinal)
        sess = _Session(id=name, turn=-1, end=end, failed=False, keep=keep)
        record.session = sess.id
        record.turn = 0
        record.parent_session = parent.id if parent is not None else None
        return sess

    def _match(self, data: bytes | bytearray | memoryview, ids: Sequence[int], t: float) -> _Prompt | None:
        """The longest remembered prompt that is a strict byte prefix of `data` and ended by `t`."""
        size = self._hasher.block_size
        full = min(len(data) // size, len(ids))
        view = memoryview(data)
        for n in range(full, -1, -1):
            bucket = self._buckets.get(ids[n - 1] if n else _ROOT)
            if not bucket:
                continue
            for p in reversed(bucket):
                if p.length >= len(data) or p.end > t + LATE_S:
                    continue
                start = n * size
                if p.tail_len and self._digest(view[start:start + p.tail_len]) != p.tail:
                    continue
                return p
        return None

    def _digest(self, tail: bytes | memoryview) -> int:
        return self._hasher.hash_bytes(tail)[0]

    def _remember(self, data: bytes | bytearray | memoryview, ids: Sequence[int], sess: _Session, end: float) -> None:
        size = self._hasher.block_size
        n = min(len(data) // size, len(ids))
        tail_len = len(data) - n * size
        bucket_key = ids[n - 1] if n else _ROOT
        p = _Prompt(length=len(data), tail_len=tail_len, tail=self._digest(memoryview(data)[n * size:]) if tail_len else 0,
                    bucket=bucket_key, session=sess, turn=sess.turn, end=end)
        bucket = self._buckets.setdefault(bucket_key, [])
        bucket.append(p)
        if len(bucket) > MAX_BUCKET:
            del bucket[0]
        self._order.append(p)
        if len(self._order) > self._max:
            self._forget(self._order.popleft())

    def _forget(self, p: _Prompt) -> None:
        bucket = self._buckets.get(p.bucket)
        if bucket is None:
            return
        with contextlib.suppress(ValueError):  # already pushed out of a full bucket
            bucket.remove(p)
        if not bucket:
            del self._buckets[p.bucket]

    def _expire(self, now: float) -> None:
        """Forget prompts that ended longer than the window ago (keyed sessions are bounded by count)."""
        horizon = now - self.window_s
        order = self._order
        while order and order[0].end < horizon:
            self._forget(order.popleft())
