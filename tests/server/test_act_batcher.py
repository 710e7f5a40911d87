"""ActBatcher.submit: a caller queues its rows and goes on; one batched forward answers every
request of a kind with its own rows."""

from __future__ import annotations

import threading

import numpy as np
from conftest import wait_until

from service.server.act_batcher import ActBatcher
from service.types import ActMode, ActResult


def test_submitted_requests_return_at_once_and_get_their_own_rows(
    rng: np.random.Generator,
) -> None:
    running, release = threading.Event(), threading.Event()
    batches: list[int] = []

    def run(parts: list[np.ndarray], mode: ActMode, epsilon: float) -> ActResult:
        running.set()
        release.wait(10)
        obs = np.concatenate(parts)
        batches.append(len(parts))
        # each row's answer is a function of that row alone, so a caller can check its own
        return ActResult((obs[:, 0] * 1000).astype(np.int32), obs[:, 1], obs[:, 2], 7)

    batcher = ActBatcher(run, max_batch=1024, max_wait_s=0.0)
    first = batcher.submit(rng.random((1, 3), np.float32), ActMode.SAMPLE, 0.0)
    wait_until(running.is_set, 10, "the worker held in `run` by the first request")
    sizes = rng.integers(1, 9, size=6)
    inputs = [rng.random((int(n), 3), np.float32) for n in sizes]
    futures = [batcher.submit(obs, ActMode.SAMPLE, 0.0) for obs in inputs]  # none blocks
    assert not any(future.done() for future in futures) and batcher.pending() == len(inputs)
    release.set()
    first.result(10)
    for obs, future in zip(inputs, futures, strict=True):
        result = future.result(10)
        assert np.array_equal(result.actions, (obs[:, 0] * 1000).astype(np.int32))
        assert np.array_equal(result.log_probs, obs[:, 1]) and result.policy_version == 7
    assert batches == [1, len(inputs)]  # the six queued behind the first ran as one batch
    batcher.close()
