"""A bounded FIFO of Steps, applied one at a time, in arrival order, by one worker thread."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.errors import Abandoned, QueueFull, Unavailable
from service.types import StepResult

Work = TypeVar("Work")  # what one Step applies: the engine's rollout with its key


@dataclass
class _Job(Generic[Work]):
    work: Work
    caller_waiting: Callable[[], bool]
    future: Future[StepResult] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)


class StepQueue(Generic[Work]):
    """Backpressure, not blocking: `submit` on a full queue raises QueueFull at once.

    A job whose caller has gone by the time it reaches the worker is dropped before it touches
    the trainer, so a Step is applied whole or not at all.
    """

    def __init__(self, apply: Callable[[Work, float], StepResult], capacity: int) -> None:
        self._apply = apply
        self._capacity = capacity
        self._jobs: queue.Queue[_Job[Work] | None] = queue.Queue(maxsize=capacity)
        self._accepting = True
        self._deadline = float("inf")  # perf_counter time after which queued Steps are refused
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="trident-steps", daemon=True)
        self._worker.start()

    def submit(self, work: Work, caller_waiting: Callable[[], bool]) -> Future[StepResult]:
        job = _Job(work, caller_waiting)
        with self._lock:
            if not self._accepting:
                raise Unavailable("the server is draining and takes no new Steps")
            try:
                self._jobs.put_nowait(job)
            except queue.Full:
                raise QueueFull(
                    f"step queue: expected a free slot, got {self._capacity} Steps waiting; "
                    "retry later"
                ) from None
        return job.future

    @property
    def depth(self) -> int:
        return self._jobs.qsize()

    def close(self, grace_s: float = float("inf")) -> None:
        """Stop accepting, let the worker apply queued Steps for up to `grace_s`, and wait for it.

        A Step still queued when the grace runs out is answered UNAVAILABLE, never applied, so
        its caller can send it again elsewhere.
        """
        with self._lock:
            self._accepting = False
            self._deadline = time.perf_counter() + grace_s
        self._jobs.put(None)
        self._worker.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if not job.caller_waiting():
                job.future.set_exception(Abandoned("caller left before the Step started"))
                continue
            if time.perf_counter() > self._deadline:
                job.future.set_exception(
                    Unavailable("the server's shutdown grace ran out before this Step started")
                )
                continue
            queued_ms = 1e3 * (time.perf_counter() - job.enqueued)
            try:
                job.future.set_result(self._apply(job.work, queued_ms))
            except Exception as error:  # delivered to the waiting handler, which maps it
                job.future.set_exception(error)
