"""StepQueue's drain: Steps that start within the grace are applied in order, later ones are
answered UNAVAILABLE without touching the trainer, and new ones are refused."""

from __future__ import annotations

import threading

import pytest
from conftest import wait_until

from service.errors import QueueFull, Unavailable
from service.server.step_queue import StepQueue
from service.types import StepResult


class Recorder:
    """Stands in for the trainer: records which rollouts it applied, optionally held by a gate."""

    def __init__(self) -> None:
        self.applied: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, rollout: int, queued_ms: float) -> StepResult:
        self.entered.set()
        self.gate.wait(10)
        self.applied.append(rollout)
        return rollout  # type: ignore[return-value]


def submit_all(steps: StepQueue, count: int) -> list:
    return [steps.submit(index, lambda: True) for index in range(count)]  # type: ignore[arg-type]


def test_close_applies_what_starts_within_grace_and_refuses_the_rest() -> None:
    trainer = Recorder()
    trainer.gate.clear()  # the first Step holds the worker until close() has set its deadline
    steps = StepQueue(trainer, capacity=3)  # type: ignore[arg-type]
    futures = submit_all(steps, 1)
    assert trainer.entered.wait(10), "the worker never started the first Step"
    futures += [steps.submit(index, lambda: True) for index in (1, 2, 3)]  # type: ignore[arg-type]
    closer = threading.Thread(target=steps.close, args=(0.0,))
    closer.start()
    wait_until(lambda: refused(steps), 10, "close() refusing new Steps")
    trainer.gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert futures[0].result(0) == 0 and trainer.applied == [0]
    for future in futures[1:]:
        with pytest.raises(Unavailable, match="grace ran out"):
            future.result(0)


def refused(steps: StepQueue) -> bool:
    """Whether a new Step is refused as draining (the probe is never accepted: the queue is
    full until close() refuses)."""
    try:
        steps.submit(9, lambda: True)  # type: ignore[arg-type]
    except QueueFull:
        return False
    except Unavailable as error:
        return "draining" in str(error)
    raise AssertionError("a probe Step was accepted by a full queue")


def test_close_without_a_grace_limit_applies_every_queued_step_in_order() -> None:
    trainer = Recorder()
    steps = StepQueue(trainer, capacity=8)  # type: ignore[arg-type]
    futures = submit_all(steps, 8)
    steps.close()
    assert [future.result(0) for future in futures] == list(range(8)) == trainer.applied
