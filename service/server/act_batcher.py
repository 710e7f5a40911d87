"""Central inference (SEED RL's idea): concurrent Act calls are answered by one batched forward.

Two threads, so the host work of one batch overlaps the device work of another: the launcher
takes a batch and launches its forward (staged, uploaded, queued on the device), the finisher
waits for each launched batch's outputs in launch order and answers its callers. At most
`PIPELINE_DEPTH` batches are launched and not yet answered.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from service.errors import Unavailable
from service.types import ActMode, ActResult

# Batches launched and not yet answered: one on the device while the next is staged behind it.
PIPELINE_DEPTH = 2

# A launched forward's outputs on the host (waits for the device).
Finish = Callable[[], ActResult]
# One forward over the stacked rows of the requests' observations, in order: launch it and
# return at once with what waits for its outputs.
LaunchBatch = Callable[[list[np.ndarray], ActMode, float], Finish]


# eq=False: requests compare by identity. A generated __eq__ would compare `obs` arrays, and
# `_pending.remove(request)` would raise ValueError ("truth value of an array is ambiguous") when
# a request of another (mode, ε) stands before it, killing the worker and hanging every later Act.
@dataclass(eq=False)
class _Request:
    obs: np.ndarray
    key: tuple[ActMode, float]
    future: Future[ActResult] = field(default_factory=Future)


class ActBatcher:
    """Coalesces requests of the same (mode, ε) into batches of at most `max_batch` rows.

    The launcher takes the oldest request, waits up to `max_wait_s` for more of its kind (or
    until the batch is full), launches one forward; the finisher hands each caller its rows. A
    request larger than `max_batch` runs alone.
    """

    def __init__(self, launch: LaunchBatch, max_batch: int, max_wait_s: float) -> None:
        self._launch = launch
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._pending: list[_Request] = []
        self._wake = threading.Condition()
        self._closed = False
        self._room = threading.Semaphore(PIPELINE_DEPTH)  # launched batches not yet answered
        self._launched: queue.SimpleQueue[tuple[list[_Request], Finish] | None] = (
            queue.SimpleQueue())  # fmt: skip
        self._launcher = threading.Thread(target=self._launch_loop, name="trident-act",
                                          daemon=True)  # fmt: skip
        self._finisher = threading.Thread(target=self._finish_loop, name="trident-act-finish",
                                          daemon=True)  # fmt: skip
        self._launcher.start()
        self._finisher.start()

    def act(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> ActResult:
        return self.submit(obs, mode, epsilon).result()

    def submit(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        """Queue `obs` and return at once: its rows' answer comes in the Future, so a caller
        that must not block (a thread reading several front ends' requests) need not."""
        request = _Request(obs, (mode, epsilon))
        with self._wake:
            if self._closed:  # the launcher is gone: nothing would answer
                raise Unavailable("the server is draining and acts no more")
            self._pending.append(request)
            self._wake.notify()
        return request.future

    def pending(self) -> int:
        """Requests waiting to join a batch (not those in the batches launched)."""
        with self._wake:
            return len(self._pending)

    def close(self) -> None:
        """Answer what is pending, then stop both threads."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._launcher.join()
        self._finisher.join()

    def _rows_of_kind(self, key: tuple[ActMode, float]) -> int:
        return sum(r.obs.shape[0] for r in self._pending if r.key == key)

    def _take_batch(self) -> list[_Request] | None:
        with self._wake:
            while not self._pending and not self._closed:
                self._wake.wait()
            if not self._pending:
                return None
            key = self._pending[0].key
            deadline = time.monotonic() + self._max_wait_s
            while self._rows_of_kind(key) < self._max_batch and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._wake.wait(remaining):
                    break
            batch, rows = [], 0
            for request in list(self._pending):
                size = request.obs.shape[0]
                if request.key == key and (not batch or rows + size <= self._max_batch):
                    batch.append(request)
                    rows += size
                    self._pending.remove(request)
            return batch

    def _launch_loop(self) -> None:
        while True:
            self._room.acquire()  # before taking a batch: requests gather while none is free
            batch = self._take_batch()
            if batch is None:
                break
            mode, epsilon = batch[0].key
            try:
                finish = self._launch([r.obs for r in batch], mode, epsilon)
            except Exception as error:
                self._room.release()
                for request in batch:
                    request.future.set_exception(error)
                continue
            self._launched.put((batch, finish))
        self._launched.put(None)

    def _finish_loop(self) -> None:
        while (launched := self._launched.get()) is not None:
            batch, finish = launched
            try:
                result = finish()
            except Exception as error:
                for request in batch:
                    request.future.set_exception(error)
                continue
            finally:
                self._room.release()
            start = 0
            for request in batch:
                rows = slice(start, start + request.obs.shape[0])
                start = rows.stop
                request.future.set_result(
                    ActResult(
                        actions=result.actions[rows],
                        log_probs=result.log_probs[rows],
                        values=result.values[rows],
                        policy_version=result.policy_version,
                    )
                )
