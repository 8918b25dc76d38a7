"""HTTP/1.1 framing for the upstream client: the request bytes, the response head, the chunked decoder.

Pure and synchronous (bytes in, bytes out), so every piece is tested split at every byte. A chunk that
arrives whole in one read is passed on as one slice; nothing here interprets or keeps the body.
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict

MAX_HEAD_BYTES = 1 << 16
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})


class ProtocolError(Exception):
    """The upstream's bytes are not valid HTTP/1.1 framing."""


def request_bytes(method: str, target: str, host: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """One request: `Host` first, the forwarded headers, then `Content-Length` (like aiohttp's client)."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    lines += [f"{k}: {v}\r\n" for k, v in headers]
    if body or method not in _NO_BODY_METHODS:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape") + body


class Head:
    """A parsed response head: status, reason, headers and how the body is delimited."""

    __slots__ = ("chunked", "headers", "keep_alive", "length", "reason", "status")

    def __init__(self, status: int, reason: str, headers: CIMultiDict[str], length: int | None, chunked: bool,
                 keep_alive: bool) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length
        self.chunked = chunked
        self.keep_alive = keep_alive


def parse_head(raw: bytes) -> Head:
    """Parse a response head (status line and header lines, without the blank line)."""
    lines = raw.decode("utf-8", "surrogateescape").split("\r\n")
    parts = lines[0].split(" ", 2)
    version = parts[0]
    if len(parts) < 2 or not version.startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    pairs = []
    length: int | None = None
    chunked = False
    keep_alive = version != "HTTP/1.0"
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name[-1] in " \t" or name[0] in " \t":
            raise ProtocolError(f"bad header line {line[:80]!r}")
        value = value.strip(" \t")
        pairs.append((name, value))
        key = name.lower()
        if key == "content-length":
            if not value.isdigit() or not value.isascii() or (length is not None and length != int(value)):
                raise ProtocolError(f"bad Content-Length {value[:40]!r}")
            length = int(value)
        elif key == "transfer-encoding":
            chunked = value.lower().rsplit(",", 1)[-1].strip() == "chunked"
            if not chunked:
                raise ProtocolError(f"unsupported Transfer-Encoding {value[:40]!r}")
        elif key == "connection":
            tokens = {t.strip() for t in value.lower().split(",")}
            if "close" in tokens:
                keep_alive = False
            elif "keep-alive" in tokens:
                keep_alive = True
    if chunked:
        length = None
    return Head(status, reason, CIMultiDict(pairs), length, chunked, keep_alive)


_SIZE, _DATA, _CRLF, _TRAILER, _END = range(5)
_SIZE_ODD = frozenset(b"+- \t")  # int() accepts these; the strict slow path rejects or handles them


class ChunkedDecoder:
    """Transfer-Encoding: chunked → body bytes. `feed` returns what it could decode; `done` at the last chunk."""

    __slots__ = ("_buf", "_left", "_state", "extra")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0
        self._state = _SIZE
        self.extra = b""  # bytes after the end of the body (the connection cannot be reused)

    @property
    def done(self) -> bool:
        return self._state == _END

    def feed(self, data: bytes) -> bytes:
        if self._state != _SIZE or self._buf:
            return self._slow(data)
        # fast path: whole chunks back to back (one streamed event per chunk, or several coalesced)
        i, n = 0, len(data)
        out: list[bytes] | None = None
        first = b""
        while True:
            j = data.find(b"\r\n", i)
            if not 0 < j - i <= 16:
                break
            try:
                size = int(data[i:j], 16)
            except ValueError:
                break  # an extension (`;…`) or bad framing: the strict path decides
            end = j + 2 + size
            if size <= 0 or end + 2 > n or data[end : end + 2] != b"\r\n" or data[i] in _SIZE_ODD:
                break
            if end + 2 == n and out is None and not first:
                return data[j + 2 : end]  # exactly one chunk
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
            elif state in (_SIZE, _TRAILER):
                j = buf.find(b"\r\n", i)
                if j < 0:
                    if n - i > 4096:
                        raise ProtocolError("chunk size line too long")
                    self._buf = buf[i:]
                    break
                line = buf[i:j]
                i = j + 2
                if state == _TRAILER:
                    if not line:
                        self._state = _END
                    continue
                size_text = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                if size < 0 or not size_text or size_text[:1] in b"+-":
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}")
                if size == 0:
                    self._state = _TRAILER
                else:
                    self._left = size
                    self._state = _DATA
            elif state == _CRLF:
                if n - i < 2:
                    self._buf = buf[i:]
                    break
                if buf[i : i + 2] != b"\r\n":
                    raise ProtocolError("missing CRLF after chunk data")
                i += 2
                self._state = _SIZE
            else:  # _END
                self.extra = buf[i:]
                break
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)
