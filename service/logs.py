"""Structured logging: one JSON object per line on stderr, one line per event."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
logger = logging.getLogger("trident")


class JsonLines(logging.Formatter):
    """`{"ts", "level", "event", **context, **fields}` with fields from
    `extra={"fields": {...}}`; `context` names the process on every line (a front end's)."""

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.context = context or {}

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "event": record.getMessage(),
            **self.context,
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str, **context: Any) -> None:
    """Send `trident` events at `level` and above to stderr as JSON lines, each with the
    `context` fields."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines(context))
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


@dataclass
class _Repeats:
    """A key's events since its period began: how many went unlogged, and the latest one."""

    since: float
    count: int = 0
    latest: tuple[int, str, dict[str, Any]] = field(default_factory=lambda: (0, "", {}))


class Throttled:
    """Events that repeat, such as one client's refusals: each key's first is logged whole,
    later ones in the same `every_s` are counted and said as one line with the count (and the
    latest one's fields) when the period is over, at the next event of any key or at `flush()`.
    A client retrying in a loop writes a line a period, not a line a try. A key quiet for a
    whole period is forgotten (memory stays with the keys of the last period), and its next
    event is logged whole again."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._keys: dict[Hashable, _Repeats] = {}
        self._lock = threading.Lock()

    def event(self, level: int, message: str, key: Hashable, /, **fields: Any) -> None:
        now = self.clock()
        with self._lock:
            due = self._periods_over(now)
            repeats = self._keys.get(key)
            if repeats is None:
                self._keys[key] = _Repeats(since=now)
            else:
                repeats.count += 1
                repeats.latest = (level, message, fields)
        for line in due:
            event(*line[:2], **line[2])
        if repeats is None:
            event(level, message, **fields, later=f"more like it are counted, and said as "
                  f"counts every {self.every_s:g} s")  # fmt: skip

    def flush(self) -> None:
        """Say the counts not yet said (a server about to stop)."""
        with self._lock:
            due = self._periods_over(self.clock(), everything=True)
        for line in due:
            event(*line[:2], **line[2])

    def _periods_over(
        self, now: float, everything: bool = False
    ) -> list[tuple[int, str, dict[str, Any]]]:
        """The count lines of the keys whose period is over (`everything`: of every key);
        forgets the keys with none."""
        lines = []
        for key, repeats in list(self._keys.items()):
            if not everything and now - repeats.since < self.every_s:
                continue
            if not repeats.count:
                del self._keys[key]
                continue
            level, message, fields = repeats.latest
            over_s = round(now - repeats.since, 1)
            lines.append((level, message, {**fields, "repeated": repeats.count, "over_s": over_s}))
            repeats.since, repeats.count = now, 0
        return lines
