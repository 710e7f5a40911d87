"""Acting that never waits for learning: Act requests answered by one batched forward
(`ActBatcher`) on the published snapshot of the policy.

The snapshot (`Trainer.snapshot`: its own copy of the parameters, its own executor) is read
under this room's lock. The Learner publishes each Step's parameters to it under the same lock
(taken after the learner's own, always in that order), and a Restore holds it while the state
is replaced (the state's Act counter with it), so an Act reads one published state whole. The
version an Act reports is the snapshot's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import numpy as np

from service.server.act_batcher import ActBatcher
from service.server.metrics import Metrics
from service.trainer.trainer import Trainer
from service.types import ActMode, ActResult


class Acting:
    """Act on `trainer`'s published policy; `clock` (seconds) times the batched forward."""

    def __init__(self, trainer: Trainer, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.metrics, self.clock = metrics, clock
        self._lock = threading.Lock()  # the snapshot and the act counter; after the learner's
        self._policy = trainer.snapshot()
        server = trainer.config.server
        self._policy.warm_up(server.act_max_batch)  # Acts of any size meet no capture
        self._batcher = ActBatcher(self._act_batch, server.act_max_batch,
                                   server.act_max_wait_ms / 1e3)  # fmt: skip

    def submit(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        """Actions for `obs` (checked by the caller), batched with the Acts of other callers,
        as a Future returned at once (a reader of front ends' requests must not block); `obs`
        is read until it is done."""
        return self._batcher.submit(obs, mode, epsilon)

    @property
    def queue_depth(self) -> int:
        """Act requests waiting to join a batch: a load signal beside the Step queue's depth."""
        return self._batcher.pending()

    def publish(self) -> None:
        """Acts from now on read the live parameters as they are."""
        with self._lock:
            self._policy.publish()

    @contextmanager
    def held(self) -> Iterator[None]:
        """No Act runs while the block replaces the live state; the state it leaves is
        published before Acts go on (nothing is, where the block raises)."""
        with self._lock:
            yield
            self._policy.publish()

    def close(self) -> None:
        """Answer the Acts pending, then stop the batcher."""
        self._batcher.close()

    def _act_batch(self, parts: list[np.ndarray], mode: ActMode, epsilon: float) -> ActResult:
        """One forward for the batched requests' observations (checked by the servicer)."""
        with self._lock:  # the timer starts once a publish in progress has let go
            started = self.clock()
            result = self._policy.act_rows(parts, mode, epsilon)
            seconds = self.clock() - started
        self.metrics.observe_act(result.actions.shape[0], seconds)
        return result
