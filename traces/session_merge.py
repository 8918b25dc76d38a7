"""Merging gateway captures into one trace with its sessions recomputed (`slogate trace merge`).

Captures of several gateways (replicas, restarts) go on one timeline; a session split over them is
made whole again: keyed sessions share their hash already, a prefix-continuation session (`p-…`)
whose first turn extends, block by block, a request of another capture is joined to it. Turns are
renumbered in arrival order and think times recomputed. Pure: never reads files or sees content.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from slogate.traces.record import RequestRecord, TraceHeader

PREFIX_ID = "p-"  # sessions derived by prefix continuation at the gateway (gateway/sessions.py)
LATE_S = 1e-3  # a continuation may arrive this much before the request it continues ended


class MergeError(ValueError):
    """The captures cannot be merged (the message names the capture and the fix)."""


class Merged(msgspec.Struct):
    header: TraceHeader
    records: list[RequestRecord]
    sessions: int
    joined: int  # sessions that were joined to a session of another capture


def merge_captures(captures: Sequence[tuple[str, TraceHeader, list[RequestRecord]]], *,
                   window_s: float = 600.0) -> Merged:
    """(label, header, records) per capture → one trace; records are changed in place."""
    if not captures:
        raise MergeError("give the captures to merge")
    salts = {h.salt_id for _, h, _ in captures if h.salt_id}
    if len(salts) > 1:
        names = ", ".join(f"{label} ({h.salt_id})" for label, h, _ in captures)
        raise MergeError(f"captures were hashed with different salts: {names}; sessions and prefixes of "
                         "different salts never match, so capture with one SLOGATE_TRACE_SALT")
    starts = [h.start_unix for _, h, _ in captures if h.start_unix > 0]
    base = min(starts) if starts else 0.0
    tagged: list[tuple[RequestRecord, int]] = []
    for i, (_, header, records) in enumerate(captures):
        shift = header.start_unix - base if header.start_unix > 0 else 0.0
        for r in records:
            r.t += shift
            tagged.append((r, i))
    tagged.sort(key=lambda x: x[0].t)
    joined = _join(tagged, window_s)
    records = [r for r, _ in tagged]
    sessions = renumber(records)
    header = msgspec.structs.replace(captures[0][1], start_unix=base, segment=0)
    return Merged(header=header, records=records, sessions=sessions, joined=joined)


def _join(tagged: list[tuple[RequestRecord, int]], window_s: float) -> int:
    """Rename prefix sessions that continue a request of another capture; returns how many were joined."""
    alias: dict[str, str] = {}
    seen: set[str] = set()
    # (second-to-last chained id, id count) → (record, capture) of earlier requests: a later prompt whose
    # ids agree up to there extends it (the last id may be of a partial block, so it is not compared)
    index: dict[tuple[int, int], list[tuple[RequestRecord, int]]] = {}
    latest: dict[str, RequestRecord] = {}  # merged session → its latest record so far
    joined = 0
    for r, capture in tagged:
        original = r.session
        if original is not None and original not in seen:
            seen.add(original)
            if original.startswith(PREFIX_ID) and r.parent_session is None:
                target = _continued(r, capture, index, window_s)
                if target is not None:
                    name = alias.get(target.session or "", target.session)
                    if name is not None:
                        if latest.get(name) is target:
                            alias[original] = name
                        else:  # a branch from an older turn: a child session
                            r.parent_session = name
                            r.think = max(0.0, r.t - (target.t + (target.e2e or 0.0)))
                        joined += 1
        if original is not None:
            r.session = alias.get(original, original)
            latest[r.session] = r
        if r.parent_session is not None:
            r.parent_session = alias.get(r.parent_session, r.parent_session)
        ids = r.hash_ids
        if ids and len(ids) >= 2 and r.session is not None:
            index.setdefault((ids[-2], len(ids)), []).append((r, capture))
    return joined


def _continued(r: RequestRecord, capture: int, index: dict[tuple[int, int], list[tuple[RequestRecord, int]]],
               window_s: float) -> RequestRecord | None:
    """The longest earlier request of another capture that `r`'s prompt extends and that ended in time."""
    ids = r.hash_ids or []
    for n in range(len(ids), 1, -1):
        for prev, where in reversed(index.get((ids[n - 2], n), ())):
            end = prev.t + (prev.e2e or 0.0)
            if where == capture or end > r.t + LATE_S or r.t - end > window_s:
                continue
            if n == len(ids) and ((prev.hash_ids or ids)[-1] == ids[-1] or (r.input_tokens or 0) <= (prev.input_tokens or 0)):
                continue  # as many blocks: only a longer, different last block continues it
            return prev
    return None


def renumber(records: Sequence[RequestRecord]) -> int:
    """Turns 0, 1, … per session in arrival order and think = arrival − the previous turn's end (a
    session's first turn keeps its think only when it has a parent); returns the session count."""
    last: dict[str, RequestRecord] = {}
    for r in sorted(records, key=lambda x: x.t):
        if r.session is None:
            continue
        prev = last.get(r.session)
        if prev is None:
            r.turn = 0
            if r.parent_session is None:
                r.think = None
        else:
            r.turn = (prev.turn or 0) + 1
            r.think = max(0.0, r.t - (prev.t + (prev.e2e or 0.0)))
        last[r.session] = r
    return len(last)
