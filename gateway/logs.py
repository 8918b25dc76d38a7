"""Gateway logging: one stderr line per lifecycle event (text or JSON), never per request or per chunk.

aiohttp's own log lines can carry client addresses ("Error handling request from %s") and
exception texts; `RedactFilter` strips their arguments and exception messages so no address,
header or request content ever reaches the log.
"""

from __future__ import annotations

import logging
import sys
import traceback

import orjson


class RedactFilter(logging.Filter):
    """Keep the message template, the exception class and its frames; drop arguments and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and not record.name.startswith("slogate"):  # slogate's own arguments are safe
            record.msg = str(record.msg).replace("%s", "<redacted>").replace("%r", "<redacted>")
            record.args = None
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, _, tb = record.exc_info
            record.msg, record.args = record.getMessage(), None
            frames = "".join(f'  File "{f.filename}", line {f.lineno}, in {f.name}\n'
                             for f in traceback.extract_tb(tb, limit=20))
            record.msg = f"{record.msg} [{exc_type.__name__}; message withheld]\n{frames}".rstrip()
            record.exc_info = None
            record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (unix seconds), level, logger, msg (already redacted)."""

    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps({"ts": round(record.created, 6), "level": record.levelname.lower(),
                             "logger": record.name, "msg": record.getMessage()}).decode()


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json"
                         else logging.Formatter("%(asctime)s slogate-gateway %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    handler.addFilter(RedactFilter())  # on the handler: applies to records of every logger
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
