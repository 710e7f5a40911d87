"""Central inference (SEED RL's idea): concurrent Act calls are answered by one batched forward."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from service.errors import Unavailable
from service.types import ActMode, ActResult

# One forward over the stacked rows of the requests' observations, in order.
RunBatch = Callable[[list[np.ndarray], ActMode, float], ActResult]


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

    The worker takes the oldest request, waits up to `max_wait_s` for more of its kind (or until
    the batch is full), runs one forward and hands each caller its rows. A request larger than
    `max_batch` runs alone.
    """

    def __init__(self, run: RunBatch, max_batch: int, max_wait_s: float) -> None:
        self._run_batch = run
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._pending: list[_Request] = []
        self._wake = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="trident-act", daemon=True)
        self._worker.start()

    def submit(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        """Queue `obs` and return at once: its rows' answer comes in the Future, so a caller
        that must not block (a thread reading several front ends' requests) need not."""
        request = _Request(obs, (mode, epsilon))
        with self._wake:
            if self._closed:  # the worker is gone: nothing would answer
                raise Unavailable("the server is draining and acts no more")
            self._pending.append(request)
            self._wake.notify()
        return request.future

    def pending(self) -> int:
        """Requests waiting to join a batch (not those in the batch being run)."""
        with self._wake:
            return len(self._pending)

    def close(self) -> None:
        """Answer what is pending, then stop the worker."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join()

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

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            mode, epsilon = batch[0].key
            try:
                result = self._run_batch([r.obs for r in batch], mode, epsilon)
            except Exception as error:
                for request in batch:
                    request.future.set_exception(error)
                continue
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
