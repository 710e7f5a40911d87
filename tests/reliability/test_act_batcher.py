"""Regression: Act requests of different (mode, ε) queued together are all answered."""

from __future__ import annotations

import threading

import numpy as np
from conftest import wait_until

from service.server.act_batcher import ActBatcher
from service.types import ActMode, ActResult


def test_mixed_kinds_in_the_queue_are_all_answered() -> None:
    running, release = threading.Event(), threading.Event()

    def run(parts: list[np.ndarray], mode: ActMode, epsilon: float) -> ActResult:
        running.set()
        release.wait(10)  # the first batch holds the worker while the others queue up
        n = sum(obs.shape[0] for obs in parts)
        return ActResult(np.zeros(n, np.int32), np.zeros(n), np.zeros(n), 0)

    batcher = ActBatcher(run, max_batch=64, max_wait_s=0.0)
    answered: list[int] = []

    def act(mode: ActMode, epsilon: float) -> None:
        # A fresh obs array per call: equal arrays that are not the same object are the case.
        future = batcher.submit(np.zeros((2, 6), np.float32), mode, epsilon)
        answered.append(future.result().actions.size)

    def start(mode: ActMode, epsilon: float) -> None:
        threading.Thread(target=act, args=(mode, epsilon), daemon=True).start()

    start(ActMode.SAMPLE, 0.0)
    wait_until(running.is_set, 10, "the worker held in `run` by the first request")
    # Queued as [ε=0.2, ε=0.3, ε=0.2]: the ε=0.2 batch is removed around the ε=0.3 request.
    for epsilon in (0.2, 0.3, 0.2):
        start(ActMode.EPSILON_GREEDY, epsilon)
    wait_until(lambda: batcher.pending() == 3, 10, "three requests queued behind it")
    release.set()
    wait_until(lambda: len(answered) == 4, 10, lambda: f"every request answered ({answered})")
    assert answered == [2, 2, 2, 2]
    batcher.close()
