"""ActBatcher.submit: a caller queues its rows and goes on; one batched forward answers every
request of a kind with its own rows."""

from __future__ import annotations

import threading

import numpy as np
from conftest import wait_until

from service.server.act_batcher import PIPELINE_DEPTH, ActBatcher, Finish
from service.types import ActMode, ActResult


def test_submitted_requests_return_at_once_and_get_their_own_rows(
    rng: np.random.Generator,
) -> None:
    running, release = threading.Event(), threading.Event()
    batches: list[int] = []

    def launch(parts: list[np.ndarray], mode: ActMode, epsilon: float) -> Finish:
        running.set()
        release.wait(10)  # the launcher held: requests gather
        obs = np.concatenate(parts)
        batches.append(len(parts))
        # each row's answer is a function of that row alone, so a caller can check its own
        return lambda: ActResult((obs[:, 0] * 1000).astype(np.int32), obs[:, 1], obs[:, 2], 7)

    batcher = ActBatcher(launch, max_batch=1024, max_wait_s=0.0)
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


def test_a_batch_launches_while_the_one_before_waits_for_the_device(
    rng: np.random.Generator,
) -> None:
    """Up to PIPELINE_DEPTH batches are launched before the first is answered; the next waits
    for room, and every caller gets its own rows, in launch order."""
    device = threading.Event()  # the "device" finishes every batch launched once set
    launched: list[int] = []

    def launch(parts: list[np.ndarray], mode: ActMode, epsilon: float) -> Finish:
        obs = np.concatenate(parts)
        launched.append(obs.shape[0])

        def finish() -> ActResult:
            device.wait(10)
            return ActResult((obs[:, 0] * 1000).astype(np.int32), obs[:, 1], obs[:, 2], 3)

        return finish

    batcher = ActBatcher(launch, max_batch=1024, max_wait_s=0.0)
    inputs, futures = [], []
    for n in range(1, PIPELINE_DEPTH + 1):  # each launched alone: the one before is in flight
        inputs.append(rng.random((n, 3), np.float32))
        futures.append(batcher.submit(inputs[-1], ActMode.SAMPLE, 0.0))
        wait_until(lambda n=n: len(launched) == n, 10, f"batch {n} launched")
    late = [rng.random((int(n), 3), np.float32) for n in rng.integers(1, 9, size=3)]
    futures += [batcher.submit(obs, ActMode.SAMPLE, 0.0) for obs in late]
    wait_until(lambda: batcher.pending() == len(late), 10, "the late requests queued")
    assert len(launched) == PIPELINE_DEPTH and not any(f.done() for f in futures)
    device.set()
    for obs, future in zip(inputs + late, futures, strict=True):
        result = future.result(10)
        assert np.array_equal(result.actions, (obs[:, 0] * 1000).astype(np.int32))
        assert np.array_equal(result.values, obs[:, 2]) and result.policy_version == 3
    assert launched == [*range(1, PIPELINE_DEPTH + 1), sum(obs.shape[0] for obs in late)]
    batcher.close()


def test_a_failed_forward_fails_its_callers_alone() -> None:
    def launch(parts: list[np.ndarray], mode: ActMode, epsilon: float) -> Finish:
        n = sum(part.shape[0] for part in parts)
        if n == 2:
            raise RuntimeError("launch refused")

        def finish() -> ActResult:
            if n == 3:
                raise RuntimeError("device failed")
            return ActResult(np.zeros(n, np.int32), np.zeros(n), np.zeros(n), 0)

        return finish

    batcher = ActBatcher(launch, max_batch=1024, max_wait_s=0.0)
    for rows, error in ((2, "launch refused"), (3, "device failed"), (1, None)) * 2:
        future = batcher.submit(np.zeros((rows, 4), np.float32), ActMode.SAMPLE, 0.0)
        if error is None:
            assert future.result(10).actions.shape == (rows,)
        else:
            assert str(future.exception(10)) == error
    batcher.close()
