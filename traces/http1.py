"""The one HTTP/1.1 client codec: request bytes out, a response's head and body pieces in (RFC 9112).

Used by the gateway's upstream pool and the replay client alike. Pure and synchronous (bytes in,
bytes out): never does I/O, never keeps or interprets a body, and never copies a chunk that arrived
whole in one read more than the one slice it hands on. Strict where RFC 9112 is: anything else is a
`ProtocolError` naming the bad bytes, for the caller to fail the exchange with (error class "protocol").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from multidict import CIMultiDict

MAX_HEAD_BYTES = 1 << 16  # a response head (or the trailers) larger than this is refused
MAX_SIZE_LINE = 4096  # a chunk-size line, extensions included
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})

_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_STATUS_LINE = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: ([\t \x21-\x7e\x80-\xff]*))?")
# field-name ":" OWS field-value OWS; the value holds no control character but HTAB (RFC 9110 §5.5)
_FIELD_LINE = re.compile(rb"(" + _TCHAR + rb"+):[ \t]*((?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?)[ \t]*")
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
# chunk-size [ chunk-ext ]: 1-20 hex digits (no sign, prefix, separator or padding), `;name[=value]`…
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;" + _TCHAR + rb"+(?:=(?:" + _TCHAR + rb"+|" + _QUOTED + rb"))?)*")
_MAX_CHUNK = 1 << 63


class ProtocolError(Exception):
    """The peer's bytes are not valid HTTP/1.1 framing (the exchange fails with error class "protocol")."""


def request_bytes(method: str, target: str, host: str, headers: Iterable[tuple[str, str]] | bytes, body: bytes | bytearray, *,
                  head_only: bool = False) -> bytes:
    """One request: `Host` first, the given headers (pairs, or field lines already encoded as
    `name: value\r\n` bytes, which a proxy passes on unchanged), then `Content-Length`;
    `head_only`: without the body (a large body is written on its own, never copied)."""
    if not isinstance(headers, bytes):
        headers = "".join([f"{k}: {v}\r\n" for k, v in headers]).encode("utf-8", "surrogateescape")
    length = b"Content-Length: %d\r\n" % len(body) if body or method not in _NO_BODY_METHODS else b""
    head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%b%b\r\n" % (
        method.encode("ascii"), target.encode("utf-8", "surrogateescape"), host.encode("utf-8", "surrogateescape"),
        headers, length)
    return head if head_only or not body else head + body


class Head:
    """A final response head: status, reason, header fields and how the body is delimited.

    `fields` keeps each field's bytes as received, `(lowercased name, name, value)`, so a proxy forwards
    them unchanged (`forward_fields`); `headers` is the same as a decoded CIMultiDict, built on first
    use. With `Transfer-Encoding: chunked` any `Content-Length` was removed from both (RFC 9112 §6.3),
    so a proxy never forwards it with the decoded body.
    """

    __slots__ = ("_headers", "chunked", "connection", "content_encoding", "content_type", "fields", "keep_alive",
                 "length", "raw_reason", "status")

    def __init__(self, status: int, raw_reason: bytes, fields: list[tuple[bytes, bytes, bytes]], length: int | None,
                 chunked: bool, keep_alive: bool, connection: tuple[bytes, ...] = ()) -> None:
        self.status = status
        self.raw_reason = raw_reason
        self.fields = fields
        self.length = length  # None: chunked or read until the connection closes
        self.chunked = chunked
        self.keep_alive = keep_alive
        self.connection = connection  # the Connection header's tokens, lowercased
        self.content_type = b""
        self.content_encoding = b""
        for key, _, value in fields:
            if key == b"content-type":
                self.content_type = value
            elif key == b"content-encoding":
                self.content_encoding = value.lower()
        self._headers: CIMultiDict[str] | None = None

    @property
    def reason(self) -> str:
        return self.raw_reason.decode("utf-8", "surrogateescape")

    @property
    def headers(self) -> CIMultiDict[str]:
        if self._headers is None:
            self._headers = CIMultiDict((name.decode("ascii"), value.decode("utf-8", "surrogateescape"))
                                        for _, name, value in self.fields)
        return self._headers

    def forward_fields(self, drop: frozenset[bytes]) -> bytes:
        """The field lines a proxy sends on (`name: value\r\n` each, bytes unchanged), minus `drop`
        (lowercased names) and any field the Connection header names."""
        if self.connection:
            drop = drop | frozenset(self.connection)
        return b"".join([b"%s: %s\r\n" % (name, value) for key, name, value in self.fields if key not in drop])


def _check_line_ends(raw: bytes) -> None:
    crlf = raw.count(b"\r\n")
    if raw.count(b"\n") != crlf or raw.count(b"\r") != crlf:
        raise ProtocolError("bare CR or LF in the response head")
    if b"\0" in raw:
        raise ProtocolError("NUL in the response head")


def parse_head(raw: bytes) -> Head:
    """Parse one response head (status line and field lines, without the blank line that ends it)."""
    _check_line_ends(raw)
    lines = raw.split(b"\r\n")
    m = _STATUS_LINE.fullmatch(lines[0])
    if m is None:
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    status = int(m[2])
    fields: list[tuple[bytes, bytes, bytes]] = []
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    connection: list[bytes] = []
    raw_length = b""
    n_length = 0
    for line in lines[1:]:
        f = _FIELD_LINE.fullmatch(line)
        if f is None:
            what = "obs-fold (a continuation line)" if line[:1] in (b" ", b"\t") else "bad header line"
            raise ProtocolError(f"{what} {line[:80]!r}")
        name, value = f[1], f[2]
        key = name.lower()
        if key == b"content-length":
            lengths.update(v.strip(b" \t") for v in value.split(b","))
            raw_length = value
            n_length += 1
        elif key == b"transfer-encoding":
            codings += (c.strip(b" \t").lower() for c in value.split(b","))
        elif key == b"connection":
            connection += (c.strip(b" \t").lower() for c in value.split(b","))
        fields.append((key, name, value))
    chunked = False
    if codings:
        if codings != [b"chunked"]:
            raise ProtocolError(f"unsupported Transfer-Encoding {b', '.join(codings)[:40]!r} (only chunked)")
        chunked = True
        if lengths:  # RFC 9112 §6.3: Transfer-Encoding wins and Content-Length must not be passed on
            fields = [f for f in fields if f[0] != b"content-length"]
            lengths = set()
    length: int | None = None
    if lengths:
        value = lengths.pop()
        if lengths or not value.isdigit() or len(value) > 18:
            raise ProtocolError(f"bad Content-Length {b', '.join([value, *lengths])[:40]!r}")
        length = int(value)
        if n_length > 1 or b"," in raw_length:
            # identical repeats are allowed (RFC 9110 §8.6): pass one on, never a list
            fields = [f for f in fields if f[0] != b"content-length"] + [
                (b"content-length", b"Content-Length", b"%d" % length)]
    keep_alive = m[1] != b"0" or b"keep-alive" in connection
    if b"close" in connection:
        keep_alive = False
    return Head(status, m[3] or b"", fields, length, chunked, keep_alive, tuple(t for t in connection if t))


_HEAD, _FIXED, _UNTIL_CLOSE, _SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(8)


class ResponseParser:
    """One response on a connection: `feed` each read; it returns the body bytes that read completed.

    `head` is set once the final head arrived (interim 1xx heads other than 101 are skipped), `done`
    once the body ended. `keep_alive` says whether the connection can carry another request after
    `done`. `eof()` is the connection closing. Raises ProtocolError on bad framing.
    """

    __slots__ = ("_buf", "_left", "_max_head", "_no_body", "_state", "head", "keep_alive")

    def __init__(self, *, no_body: bool = False, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self.head: Head | None = None
        self.keep_alive = True
        self._no_body = no_body  # the request was HEAD: the response has a head only
        self._max_head = max_head_bytes
        self._buf = b""
        self._left = 0
        self._state = _HEAD

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def eof(self) -> bool:
        """The connection closed: True when that ended the response (a body read until close)."""
        self.keep_alive = False
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        state = self._state
        if state == _SIZE and not self._buf:
            return self._chunks(data)
        if state == _FIXED:
            left = self._left
            if len(data) < left:
                self._left = left - len(data)
                return data
            self._state = _DONE
            if len(data) > left:
                self.keep_alive = False  # bytes after the response: the connection is out of step
                return data[:left]
            return data
        if state == _UNTIL_CLOSE:
            return data
        if state == _HEAD:
            return self._head(data)
        if state == _DONE:
            if data:
                self.keep_alive = False
            return b""
        return self._slow(data)

    # ------------------------------------------------------------------ head
    def _head(self, data: bytes) -> bytes:
        old = self._buf
        buf = old + data if old else data
        start = len(old)  # bytes before this were checked already
        while True:
            end = buf.find(b"\r\n\r\n", start - 3 if start > 3 else 0)
            if end < 0:
                if len(buf) > self._max_head:
                    raise ProtocolError(f"response head larger than {self._max_head} bytes")
                if start and buf[start - 1] == 13:  # a CR that ended the last read
                    start -= 1
                _check_line_ends(buf[start:-1] if buf.endswith(b"\r") else buf[start:])
                self._buf = buf
                return b""
            if end > self._max_head:
                raise ProtocolError(f"response head larger than {self._max_head} bytes")
            head = parse_head(buf[:end])
            buf = buf[end + 4 :]
            start = 0
            if head.status < 100:
                raise ProtocolError(f"bad status {head.status}")
            if head.status >= 200 or head.status == 101:
                break
            # an interim response (100 Continue, 103 Early Hints): the final one follows
        self._buf = b""
        self.head = head
        self.keep_alive = head.keep_alive
        if head.status == 101:
            self.keep_alive = False  # the connection now speaks another protocol
            self._state = _DONE
        elif self._no_body or head.status in (204, 304) or head.length == 0:
            self._state = _DONE
        elif head.chunked:
            self._state = _SIZE
        elif head.length is not None:
            self._left = head.length
            self._state = _FIXED
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE
        return self.feed(buf) if buf else b""

    # ------------------------------------------------------------------ chunked body
    def _chunks(self, data: bytes) -> bytes:
        """Fast path: whole chunks back to back (one streamed event per chunk, or several coalesced)."""
        n = len(data)
        j = data.find(b"\r\n")
        if 0 < j < 16:  # the streaming case first: this read is exactly one chunk
            size_text = data[:j]
            if size_text.isalnum() and (j == 1 or data[1] not in b"xX"):
                try:
                    size = int(size_text, 16)
                except ValueError:
                    size = 0
                end = j + 2 + size
                if size and end + 2 == n and data.endswith(b"\r\n"):
                    return data[j + 2 : end]
        i = 0
        out: list[bytes] | None = None
        first = b""
        while True:
            j = data.find(b"\r\n", i, i + 17)
            if j <= i:
                break
            size_text = data[i:j]
            if not size_text.isalnum() or (j - i > 1 and data[i + 1] in b"xX"):
                break  # an extension, or bad framing: the strict path decides
            try:
                size = int(size_text, 16)
            except ValueError:
                break
            end = j + 2 + size
            if size == 0 or end + 2 > n or data[end : end + 2] != b"\r\n":
                break
            if end + 2 == n and not first:
                return data[j + 2 : end]  # exactly one chunk: one slice
            piece = data[j + 2 : end]
            if not first:
                first = piece
            else:
                if out is None:
                    out = [first]
                out.append(piece)
            i = end + 2
            if i == n:
                break
        if i < n:
            tail = self._slow(data[i:] if i else data)
            if tail:
                if not first:
                    return tail
                if out is None:
                    out = [first]
                out.append(tail)
        return first if out is None else b"".join(out)

    def _slow(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        self._buf = b""
        out: list[bytes] = []
        i, n = 0, len(buf)
        while i < n:
            state = self._state
            if state == _DATA:
                take = min(self._left, n - i)
                out.append(buf[i : i + take])
                i += take
                self._left -= take
                if self._left == 0:
                    self._state = _CRLF
            elif state == _CRLF:
                if n - i < 2:
                    if buf[i : i + 1] != b"\r":
                        raise ProtocolError("missing CRLF after chunk data")
                    self._buf = buf[i:]
                    break
                if buf[i : i + 2] != b"\r\n":
                    raise ProtocolError("missing CRLF after chunk data")
                i += 2
                self._state = _SIZE
            elif state == _SIZE:
                j = buf.find(b"\r\n", i)
                if j < 0:
                    if n - i > MAX_SIZE_LINE:
                        raise ProtocolError("chunk size line too long")
                    self._buf = buf[i:]
                    break
                line = buf[i:j]
                m = _SIZE_LINE.fullmatch(line)
                if m is None or j - i > MAX_SIZE_LINE:
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}")
                size = int(m[1], 16)
                if size >= _MAX_CHUNK:
                    raise ProtocolError(f"chunk size {m[1][:24]!r} too large")
                i = j + 2
                if size:
                    self._left = size
                    self._state = _DATA
                else:
                    self._left = 0  # bytes of trailer fields read so far
                    self._state = _TRAILER
            elif state == _TRAILER:
                j = buf.find(b"\r\n", i)
                if j < 0:
                    if self._left + n - i > self._max_head:
                        raise ProtocolError(f"trailers larger than {self._max_head} bytes")
                    self._buf = buf[i:]
                    break
                line = buf[i:j]
                i = j + 2
                self._left += len(line) + 2
                if not line:
                    self._state = _DONE
                elif (b"\r" in line or b"\n" in line or b"\0" in line or _FIELD_LINE.fullmatch(line) is None
                      or self._left > self._max_head):
                    raise ProtocolError(f"bad trailer line {line[:80]!r}")
            else:  # _DONE: bytes after the response
                self.keep_alive = False
                break
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)
