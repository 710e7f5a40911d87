"""SIGINT and SIGTERM as a request to stop at the next safe point, for the commands that run
until told (`trident train`, `trident actor`): the block asks `stopping` between units of work
and winds down (answers what it sent, saves what it must, says how to go on) instead of dying
with a traceback. A second signal exits at once (130). Work with no safe point to wait for
and nothing to save, which a rerun redoes whole (the evaluation after training), runs under
`raise_on_stop` instead: the signal raises `Stopped` where the work is."""

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


class Stopped(BaseException):
    """A SIGINT or SIGTERM inside `raise_on_stop`; `signal` names it. A BaseException, as
    KeyboardInterrupt is, so that no `except Exception` on the way takes it for an error."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


@contextmanager
def raise_on_stop(stopping: list[str]) -> Iterator[None]:
    """Inside the block a SIGINT or SIGTERM raises Stopped (its name) in the main thread; a
    stop already in `stopping` (the list of an enclosing `stop_signals`, taken between units
    of work) raises at once. A second signal exits at once (130), as under stop_signals. The
    previous handlers are put back. Outside the main thread the block just runs."""
    if stopping:
        raise Stopped(stopping[0])
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if stopping:
            raise SystemExit(130)
        stopping.append(signal.Signals(signum).name)
        raise Stopped(stopping[0])

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
