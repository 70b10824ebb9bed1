"""Logging setup: stdlib logging as text or JSON lines.

Hot paths log with ``%`` arguments so that a disabled level costs no formatting.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


# What every LogRecord has; anything else on a record came from ``extra=`` and is a field of its own.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the ``extra`` fields of the call
    (``peer``, ``client_id``, ``protocol``, ``user``, ``reason``, ``queue``, ...), and any exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Third-party libraries stay quiet unless we are debugging.
    for noisy in ("sqlalchemy", "alembic", "websockets", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.INFO)
