"""Gateway logging: one stderr line per lifecycle event (text or JSON), never per request or per chunk.

aiohttp's own log lines can carry client addresses ("Error handling request from %s") and
exception texts; `RedactFilter` strips their arguments and exception messages so no address,
header or request content ever reaches the log.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback

import orjson


class RedactFilter(logging.Filter):
    """Keep the message template, the exception class and its frames; drop arguments and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and not record.name.startswith("slogate"):  # slogate's own arguments are safe
            record.msg, record.args = _redact_args(str(record.msg), record.args)
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, _, tb = record.exc_info
            record.msg, record.args = record.getMessage(), None
            frames = "".join(f'  File "{f.filename}", line {f.lineno}, in {f.name}\n'
                             for f in traceback.extract_tb(tb, limit=20))
            record.msg = f"{record.msg} [{exc_type.__name__}; message withheld]\n{frames}".rstrip()
            record.exc_info = None
            record.exc_text = None
        return True


# one %-placeholder of a logging message: %%, or %[(key)][flags][width][.precision][length]type
_PLACEHOLDER = re.compile(r"%%|%(?:\([^)]*\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa]")


def _redact_args(msg: str, args: object) -> tuple[str, tuple | None]:
    """A library's message with every argument that is not a number replaced by <redacted> (numbers, such
    as a retry delay, carry no request data); the numbers stay arguments of their placeholders."""
    if not isinstance(args, tuple):  # a mapping (%(name)s): nothing is kept
        return _PLACEHOLDER.sub(lambda m: "%%" if m.group() == "%%" else "<redacted>", msg), None
    kept: list[object] = []
    pending = iter(args)

    def one(m: re.Match[str]) -> str:
        if m.group() == "%%":
            return "%%"
        arg = next(pending, None)
        if isinstance(arg, int | float) and not isinstance(arg, bool) and "*" not in m.group():
            kept.append(arg)
            return m.group()
        return "<redacted>"

    out = _PLACEHOLDER.sub(one, msg)
    return out, tuple(kept) if kept else None


class TextFormatter(logging.Formatter):
    """`time slogate-gateway LEVEL message`; a library's line names its logger first, since its redacted
    arguments no longer say what it is about (an OTLP exporter's "exporting <redacted> batch": spans or
    metrics?)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s slogate-gateway %(levelname)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        source = "" if record.name.startswith("slogate") else f"{record.name}: "
        return f"{record.asctime} slogate-gateway {record.levelname} {source}{record.message}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (unix seconds), level, logger, msg (already redacted)."""

    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps({"ts": round(record.created, 6), "level": record.levelname.lower(),
                             "logger": record.name, "msg": record.getMessage()}).decode()


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    handler.addFilter(RedactFilter())  # on the handler: applies to records of every logger
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
