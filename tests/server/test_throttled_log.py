"""logs.Throttled: a key's first event is logged whole, later ones in its period as one count
line when the period is over (with the latest one's fields), a quiet key is forgotten and
starts over, and `flush` says what is counted and unsaid; other keys are apart."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator

import pytest

from service import logs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged() -> Iterator[Callable[[], list[dict]]]:
    """The JSON lines logged so far, read back."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonLines())
    saved = logs.logger.handlers[:], logs.logger.level, logs.logger.propagate
    logs.logger.handlers[:], logs.logger.propagate = [handler], False
    logs.logger.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logs.logger.handlers[:], logs.logger.propagate = saved[0], saved[2]
    logs.logger.setLevel(saved[1])


def test_a_keys_repeats_are_counted_and_said_once_a_period(
    logged: Callable[[], list[dict]],
) -> None:
    clock = Clock()
    log = logs.Throttled(every_s=60.0, clock=clock)
    for attempt in range(1000):  # a client retrying in a loop, a try every 10 ms
        clock.now = attempt * 0.01
        log.event(logging.INFO, "rejected", "client a", attempt=attempt)
    log.event(logging.INFO, "rejected", "client b", attempt=0)  # another client: its own first
    clock.now = 61.0
    log.event(logging.INFO, "rejected", "client a", attempt=1000)  # a's period is over
    clock.now = 200.0
    log.event(logging.INFO, "rejected", "client c", attempt=0)  # a's next period is over; b quiet
    log.event(logging.INFO, "rejected", "client b", attempt=1)  # b forgotten: whole again
    log.event(logging.INFO, "rejected", "client c", attempt=1)
    log.flush()  # the server stops: c's repeat is said
    lines = logged()
    got = [(line["event"], line["attempt"], line.get("repeated"), line.get("over_s"))
           for line in lines]  # fmt: skip
    assert got == [
        ("rejected", 0, None, None),  # a's first
        ("rejected", 0, None, None),  # b's first
        ("rejected", 999, 999, 61.0),  # a's period: every repeat counted, the latest's fields
        ("rejected", 1000, 1, 139.0),  # a's next: the one repeat, said when c's event came
        ("rejected", 0, None, None),  # c's first
        ("rejected", 1, None, None),  # b, quiet for a period: whole again
        ("rejected", 1, 1, 0.0),  # c's repeat, said by the flush
    ]
    assert "every 60 s" in lines[0]["later"] and "later" not in lines[2]
