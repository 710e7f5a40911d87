"""StepQueue: the learner's Steps from the queued rollouts (gathered side by side in arrival
order up to a Step's columns, a request's own Step alone), when a Step starts (full, nothing
more can come, the oldest rollout's wait, a drain), room and backpressure, and the drain:
Steps that start within the grace are applied in order, later ones are answered UNAVAILABLE
without touching the trainer, and new ones are refused."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from conftest import wait_until

from service.errors import Abandoned, QueueFull, Unavailable
from service.server.step_queue import StepQueue

FOREVER = 3600.0  # a max wait no test reaches
LAYOUT = (5, 6, True, 3)  # any hashable: rollouts of one layout are gathered together


class Recorder:
    """Stands in for the engine: records the work of each Step it applied, optionally held by
    a gate; answers each work with itself."""

    def __init__(self) -> None:
        self.steps: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, taken: list[tuple[str, float]]) -> list:
        self.entered.set()
        self.gate.wait(10)
        self.steps.append([work for work, _ in taken])
        return [work for work, _ in taken]


def queue(
    trainer: Recorder, capacity: int = 8, max_wait_s: float = FOREVER, base: int = 4
) -> StepQueue:
    return StepQueue(trainer, capacity, max_wait_s, lambda: base)  # type: ignore[arg-type]


def here() -> bool:
    return True


def gathered(steps: StepQueue, work: str, columns: int, layout: object = LAYOUT,
             waiting: Callable[[], bool] = here):  # fmt: skip
    return steps.submit(work, waiting, columns, layout, must_fit=False)  # type: ignore[arg-type]


def test_rollouts_fill_a_step_of_the_learners_size_in_arrival_order() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=4)
    seat = steps.open_seat(2)  # a stream still sending: a Step waits for its columns
    futures = [gathered(steps, name, 1) for name in "abc"]
    futures.append(gathered(steps, "d", 1))  # the fourth column: the Step is full
    futures += [gathered(steps, name, 2) for name in "ef"]
    wait_until(lambda: len(trainer.steps) == 2, 10, "two full Steps")
    assert trainer.steps == [["a", "b", "c", "d"], ["e", "f"]]
    assert [future.result(1) for future in futures] == list("abcdef")
    seat.close()
    steps.close()


def test_a_rollout_that_would_not_fit_starts_the_next_step_and_a_large_one_is_alone() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=4)
    seat = steps.open_seat(1)
    gathered(steps, "a", 3)
    gathered(steps, "b", 2)  # 3 + 2 > 4: the Step of "a" is as full as it gets
    wait_until(lambda: trainer.steps, 10, "the first Step")
    gathered(steps, "big", 9)  # larger than a Step: one of its own, after "b"'s
    wait_until(lambda: len(trainer.steps) == 3, 10, "the Steps of b and of big")
    gathered(steps, "c", 1)
    seat.close()  # no stream left: nothing more can come, so "c" starts alone
    wait_until(lambda: len(trainer.steps) == 4, 10, "the last Step")
    assert trainer.steps == [["a"], ["b"], ["big"], ["c"]]
    steps.close()


def test_a_step_grows_with_the_open_streams_columns() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=2)
    seats = [steps.open_seat(3), steps.open_seat(3)]
    assert steps.step_columns() == 6  # each stream adds about one rollout to a Step
    gathered(steps, "a", 3)
    gathered(steps, "b", 3)
    wait_until(lambda: trainer.steps, 10, "a Step of both streams' rollouts")
    assert trainer.steps == [["a", "b"]]
    for seat in seats:
        seat.close()
    assert steps.step_columns() == 2
    steps.close()


def test_a_step_starts_when_every_open_stream_waits() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=100)
    seats = [steps.open_seat(1), steps.open_seat(1)]
    gathered(steps, "a", 1)
    with seats[0].waiting():
        gathered(steps, "b", 1)
        with seats[1].waiting():  # a synchronous stream's wait for its Step: nothing comes
            wait_until(lambda: trainer.steps, 10, "a partial Step")
    assert trainer.steps == [["a", "b"]]
    for seat in seats:
        seat.close()
    steps.close()


def test_a_step_starts_after_the_oldest_rollouts_longest_wait() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=100, max_wait_s=0.05)
    seat = steps.open_seat(1)  # still sending, but slowly
    future = gathered(steps, "a", 1)
    assert future.result(10) == "a" and trainer.steps == [["a"]]
    seat.close()
    steps.close()


def test_other_layouts_and_requests_own_steps_are_not_gathered() -> None:
    trainer = Recorder()
    trainer.gate.clear()  # the first Step holds the worker while the rest queue up
    steps = queue(trainer, base=4)
    seat = steps.open_seat(4)
    gathered(steps, "first", 4)
    assert trainer.entered.wait(10)
    gathered(steps, "a", 1)
    steps.submit("own", here, 1)  # type: ignore[arg-type]
    gathered(steps, "other layout", 1, layout=(9, 6, False, None))
    gathered(steps, "b", 3)
    trainer.gate.set()
    seat.close()
    wait_until(lambda: len(trainer.steps) == 4, 10, "four Steps")
    assert trainer.steps == [["first"], ["a", "b"], ["own"], ["other layout"]]
    steps.close()


def test_a_full_queue_refuses_a_request_and_makes_a_stream_wait_for_room() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, capacity=1, base=4)
    seat = steps.open_seat(4)
    gathered(steps, "training", 4)
    assert trainer.entered.wait(10)
    steps.submit("queued", here, 4)  # type: ignore[arg-type]
    with pytest.raises(QueueFull, match=r"server\.step_queue_size"):
        steps.submit("refused", here, 1)  # type: ignore[arg-type]
    waited = threading.Event()

    def stream() -> None:
        steps.wait_for_room(4, here, seat)
        waited.set()

    waiter = threading.Thread(target=stream)
    waiter.start()
    assert not waited.wait(0.2)  # no room while the queued Step waits
    trainer.gate.set()  # the worker takes "queued" out: room
    waiter.join(10)
    assert waited.is_set()
    trainer.gate.clear()
    steps.submit("queued again", here, 4)  # type: ignore[arg-type]
    steps.submit("and again", here, 4, must_fit=False)  # type: ignore[arg-type]
    left = threading.Event()
    with pytest.raises(Abandoned):  # a stream whose caller left stops waiting
        steps.wait_for_room(4, left.is_set, seat)
    trainer.gate.set()
    seat.close()
    steps.close()


def test_a_caller_that_left_is_dropped_from_its_step_alone() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=3)
    seat = steps.open_seat(3)
    gone = gathered(steps, "gone", 1, waiting=lambda: False)
    kept = [gathered(steps, name, 1) for name in "ab"]
    assert [future.result(10) for future in kept] == ["a", "b"]
    with pytest.raises(Abandoned):
        gone.result(10)
    assert trainer.steps == [["a", "b"]]
    seat.close()
    steps.close()


def submit_all(steps: StepQueue, count: int) -> list:
    return [steps.submit(index, here, 1) for index in range(count)]  # type: ignore[arg-type]


def test_close_applies_what_starts_within_grace_and_refuses_the_rest() -> None:
    trainer = Recorder()
    trainer.gate.clear()  # the first Step holds the worker until close() has set its deadline
    steps = queue(trainer, capacity=3)
    futures = submit_all(steps, 1)
    assert trainer.entered.wait(10), "the worker never started the first Step"
    futures += [steps.submit(index, here, 1) for index in (1, 2, 3)]  # type: ignore[arg-type]
    closer = threading.Thread(target=steps.close, args=(0.0,))
    closer.start()
    wait_until(lambda: refused(steps), 10, "close() refusing new Steps")
    trainer.gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert futures[0].result(0) == 0 and trainer.steps == [[0]]
    for future in futures[1:]:
        with pytest.raises(Unavailable, match="grace ran out"):
            future.result(0)


def refused(steps: StepQueue) -> bool:
    """Whether a new Step is refused as draining (the probe is never accepted: the queue is
    full until close() refuses)."""
    try:
        steps.submit(9, here, 1)  # type: ignore[arg-type]
    except QueueFull:
        return False
    except Unavailable as error:
        return "draining" in str(error)
    raise AssertionError("a probe Step was accepted by a full queue")


def test_close_without_a_grace_limit_applies_every_queued_step_in_order() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, capacity=8)
    futures = submit_all(steps, 8)
    trainer.gate.set()
    seat = steps.open_seat(100)  # a stream that would fill more: a drain does not wait for it
    gathered(steps, "partial", 1)
    steps.close()
    assert [future.result(0) for future in futures] == list(range(8))
    assert trainer.steps == [[k] for k in range(8)] + [["partial"]]
    seat.close()
