"""Structured logging: one JSON object per line on stderr, one line per event."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
logger = logging.getLogger("trident")


class JsonLines(logging.Formatter):
    """`{"ts", "level", "event", **fields}` with fields from `extra={"fields": {...}}`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "event": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str) -> None:
    """Send `trident` events at `level` and above to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def event(level: int, message: str, /, **fields: Any) -> None:
    """Log one event with structured fields."""
    logger.log(level, message, extra={"fields": fields})


class FirstOfKind:
    """Setting warnings ("kind: advice", StepResult.warnings) come again every so many Steps
    while their cause holds; a person needs each kind once. `new(warnings)` is those whose kind
    this has not seen yet."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def new(self, warnings: list[str]) -> list[str]:
        fresh = []
        for warning in warnings:
            kind = warning.split(":", 1)[0]
            if kind not in self.seen:
                self.seen.add(kind)
                fresh.append(warning)
        return fresh
