"""SIGINT and SIGTERM as a request to stop at the next safe point, for the commands that run
until told (`trident train`, `trident actor`): the block asks `stopping` between units of work
and winds down (answers what it sent, saves what it must, says how to go on) instead of dying
with a traceback. A second signal exits at once (130)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_signals() -> Iterator[list[str]]:
    """A list that holds the name of the first SIGINT or SIGTERM received inside the block
    (empty: none); a second one raises SystemExit(130). The previous handlers are put back.
    Outside the main thread (which alone may take signals) the list just stays empty."""
    stopping: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return

    def stop(signum: int, frame: object) -> None:
        if stopping:
            raise SystemExit(130)
        stopping.append(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopping
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
