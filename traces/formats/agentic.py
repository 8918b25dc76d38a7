"""Agentic session JSON (one session per file, as public agentic-coding trace collections ship them).

A file is `{"block_size", "hash_id_scope": "local"|"global", "requests": [...]}`; a request is
`{"t", "type": "n", "model", "in", "out", "hash_ids", "think_time", "api_time"}` and a subagent
entry `{"t", "type": "subagent", "requests": [...]}` whose requests form a child session. Import
only; pure file conversion (never the network, never prompt text).
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from slogate.traces.record import RequestRecord, TraceHeader
from slogate.traces.segments import TraceError

NAME = "agentic"
SUFFIXES = (".agentic.json",)
DEFAULT_BLOCK_TOKENS = 64


class Entry(msgspec.Struct, kw_only=True):
    """One request (`type: "n"`) or one subagent (`type: "subagent"` with nested `requests`)."""

    t: float = 0.0
    type: str = "n"
    model: str | None = None
    # "in"/"out" are Python keywords: renamed fields
    input: int | None = msgspec.field(default=None, name="in")
    output: int | None = msgspec.field(default=None, name="out")
    hash_ids: list[int] = []
    think_time: float | None = None
    api_time: float | None = None
    requests: list[Entry] = []


class SessionFile(msgspec.Struct, kw_only=True):
    block_size: int = DEFAULT_BLOCK_TOKENS
    hash_id_scope: str = "local"
    session_id: str | None = None
    requests: list[Entry] = []


_decoder = msgspec.json.Decoder(SessionFile)


def sniff(head: bytes) -> bool:
    h = head.lstrip()
    return h[:1] == b"{" and b'"requests"' in h and (b'"hash_id_scope"' in h or b'"type"' in h)


def files(path: str | os.PathLike[str]) -> list[Path]:
    """The session files of a path: the file itself, or a directory's `*.json` files in name order."""
    p = Path(path)
    return sorted(q for q in p.iterdir() if q.is_file() and q.suffix == ".json") if p.is_dir() else [p]


def load(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> tuple[TraceHeader, list[RequestRecord]]:
    """Every session file (each a concurrent session starting at t = 0), records in time order."""
    plist = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    all_files = [f for p in plist for f in files(p)]
    if not all_files:
        raise TraceError(str(plist[0]), "no agentic session files (*.json) found")
    records: list[RequestRecord] = []
    header_bs: int | None = None
    names: set[str] = set()
    for f in all_files:
        data = f.read_bytes().removeprefix(codecs.BOM_UTF8)  # a UTF-8 byte-order mark is not content
        try:
            doc = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise TraceError(str(f), f"cannot read as an agentic session file: {_with_line(str(exc), data)} "
                             "(expected block_size, hash_id_scope and requests)") from None
        if doc.hash_id_scope not in ("local", "global"):
            raise TraceError(str(f), f"bad hash_id_scope {doc.hash_id_scope!r}: use local or global")
        if doc.block_size < 1:
            raise TraceError(str(f), f"bad block_size {doc.block_size}: tokens per hash id, e.g. 64")
        _check(f, doc.requests, "requests")
        name = doc.session_id or f.name.removesuffix(".json")
        while name in names:
            name += "'"
        names.add(name)
        header_bs = header_bs or doc.block_size
        scope = name if doc.hash_id_scope == "local" else None
        block = None if doc.block_size == header_bs else doc.block_size
        _session(doc.requests, name, None, scope, block, records)
    records.sort(key=lambda r: r.t)
    header = TraceHeader(block_size=header_bs or DEFAULT_BLOCK_TOKENS, block_unit="tokens", tokens_source="usage",
                         source="import:agentic")
    return header, records


def _with_line(message: str, data: bytes) -> str:
    """msgspec's "(byte N)" with the line it is on, for a file a person can open at that line."""
    m = re.search(r"\(byte (\d+)\)", message)
    if m is None:
        return message
    line = data.count(b"\n", 0, int(m.group(1))) + 1
    return f"{message[:m.start()]}(line {line}, byte {m.group(1)}){message[m.end():]}"


def _check(path: Path, entries: list[Entry], where: str) -> None:
    """Every entry a request with both lengths or a subagent; the first one that is not names the fix."""
    for i, e in enumerate(entries):
        at = f"{where}[{i}]"
        if e.type == "subagent":
            _check(path, e.requests, f"{at}.requests")
        elif e.type != "n":
            raise TraceError(str(path), f"{at}: bad type {e.type!r}: use \"n\" (a request) or \"subagent\"")
        elif e.input is None or e.output is None:
            missing = " and ".join(k for k, v in (("in", e.input), ("out", e.output)) if v is None)
            raise TraceError(str(path), f"{at}: no {missing!r} (prompt / output tokens): every request needs "
                             "\"in\" and \"out\"".replace("'", '"'))


def _session(entries: list[Entry], session: str, parent: str | None, scope: str | None, block: int | None,
             out: list[RequestRecord]) -> None:
    """Records of one session (turns in order); subagent entries become child sessions."""
    turn = 0
    prev_end: float | None = None
    children = 0
    for e in entries:
        if e.type == "subagent":
            children += 1
            _session(e.requests, f"{session}.{children}", session, scope, block, out)
            continue
        think = e.think_time  # as given (a negative one is bad data that validate names), else derived
        if think is None and prev_end is not None:
            think = max(0.0, e.t - prev_end)  # turns that overlapped (parallel tool calls): no wait
        ids = [_scoped(scope, h) for h in e.hash_ids] if scope is not None else list(e.hash_ids)
        out.append(RequestRecord(
            t=e.t, model=e.model, input_tokens=e.input, output_tokens=e.output, hash_ids=ids or None,
            block_size=block, e2e=e.api_time, session=session, turn=turn, parent_session=parent,
            think=think,
        ))
        prev_end = e.t + (e.api_time or 0.0)
        turn += 1


def _scoped(scope: str, hash_id: int) -> int:
    """A local id made unique to its file: id 1 of two files are different blocks."""
    digest = hashlib.blake2b(f"{scope}\0{hash_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
