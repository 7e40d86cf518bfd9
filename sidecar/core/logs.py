"""Structured logging: one JSON object per line on stdout (what container log drivers want)."""

from __future__ import annotations

import json
import logging
import sys

from sidecar.core.masks import scrub_text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # A secret's real value never reaches the log, however it came into a message.
        return scrub_text(json.dumps(entry, ensure_ascii=False))


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # libtmux logs every tmux call at DEBUG; aiohttp's access log is off (see main).
    logging.getLogger("libtmux").setLevel(logging.WARNING)
