"""StepQueue: the learner's Steps from the queued rollouts (gathered side by side in turn by
client up to a Step's columns, a request's Step alone unless streams of its layout produce, a
Step that may start before one still gathering, clients in turn); which streams and request
clients size a Step (those producing at about the others' pace: not idle, stopped or far slower
ones); when a Step starts (full, nothing more expected, the oldest rollout's wait, a drain);
room (every client's first job, then the shared room in line) and refusals; and the drain:
Steps that start within the grace are applied in order, later ones are answered UNAVAILABLE
without touching the trainer, and new ones are refused. The queue runs on a clock the tests
move, so no outcome depends on how fast this machine is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import pytest
from conftest import wait_until

from service.errors import Abandoned, QueueFull, Unavailable
from service.server.step_queue import MAX_GRACE_S, MIN_GRACE_S, Seat, StepQueue

FOREVER = 3600.0  # a max wait no test reaches
LAYOUT = (5, 6, True, 3)  # any hashable: rollouts of one layout are gathered together
OWN = (7, 6, False, None)  # the requests' layout where no stream sends one like it
WAIT_S = 10.0  # for a condition that holds at once on any machine


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
        self.gate.wait(WAIT_S)
        self.steps.append([work for work, _ in taken])
        return [work for work, _ in taken]


class Clock:
    """The queue's clock, moved by the test alone."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue(
    trainer: Recorder,
    capacity: int = 8,
    max_wait_s: float = FOREVER,
    base: int = 4,
    clock: Clock | None = None,
) -> StepQueue:
    return StepQueue(trainer, capacity, max_wait_s, lambda: base,  # type: ignore[arg-type]
                     clock or Clock())  # fmt: skip


def here() -> bool:
    return True


def stream(steps: StepQueue, seat: Seat, work: str, columns: int, layout: Hashable = LAYOUT,
           waiting: Callable[[], bool] = here):  # fmt: skip
    """A stream's rollout, as the engine queues it: room first, then the job."""
    steps.wait_for_room(seat, columns, layout, waiting)
    return steps.submit(work, waiting, columns, seat, layout, must_fit=False)  # type: ignore[arg-type]


def own(steps: StepQueue, work: object, columns: int = 1, client: str = "unary",
        layout: Hashable = OWN):  # fmt: skip
    """A request's Step (a unary Step) of `client`: of a layout no stream sends, unless told."""
    return steps.submit(work, here, columns, client, layout)  # type: ignore[arg-type]


def test_rollouts_fill_a_step_of_the_learners_size_in_turn_by_client() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, base=4)
    one, two = steps.open_seat(1), steps.open_seat(2)
    own(steps, "first", 4)  # a Step of its own that holds the learner while the rest queue
    assert trainer.entered.wait(WAIT_S)
    futures = [stream(steps, one, name, 1) for name in "abcd"]  # a full Step's worth
    futures += [stream(steps, two, name, 2) for name in "ef"]  # queued after them
    trainer.gate.set()
    for seat in (one, two):
        seat.close()
    wait_until(lambda: len(trainer.steps) == 3, WAIT_S, "the Steps of both streams")
    # each client's first, then each one's second...; then the client served earlier first
    assert trainer.steps[1:] == [["a", "e", "b"], ["c", "f", "d"]]
    assert [future.result(WAIT_S) for future in futures] == list("abcdef")
    steps.close()


def test_a_rollout_that_would_not_fit_starts_the_next_step_and_a_large_one_is_alone() -> None:
    trainer = Recorder()
    clock = Clock()
    steps = queue(trainer, base=4, clock=clock)
    seat = steps.open_seat(1)
    stream(steps, seat, "a", 3)
    stream(steps, seat, "b", 2)  # 3 + 2 > 4: the Step of "a" is as full as it gets
    wait_until(lambda: trainer.steps, WAIT_S, "the first Step")
    stream(steps, seat, "big", 9)  # larger than a Step: one of its own, after "b"'s
    wait_until(lambda: len(trainer.steps) == 3, WAIT_S, "the Steps of b and of big")
    stream(steps, seat, "c", 1)
    seat.close()  # no stream left: nothing more can come, so "c" starts alone
    wait_until(lambda: len(trainer.steps) == 4, WAIT_S, "the last Step")
    assert trainer.steps == [["a"], ["b"], ["big"], ["c"]]
    steps.close()


def test_a_step_grows_with_the_producing_streams_columns_alone() -> None:
    trainer = Recorder()
    clock = Clock()
    steps = queue(trainer, base=2, clock=clock)
    seats = [steps.open_seat(3), steps.open_seat(3)]
    idle = [steps.open_seat(64) for _ in range(48)]  # open, and never a whole rollout
    assert steps.step_columns() == 2  # no stream has sent a rollout yet
    clock.now += 1.0
    stream(steps, seats[0], "a0", 3)
    assert steps.step_columns() == 3
    stream(steps, seats[1], "b0", 3)
    assert steps.step_columns() == 6  # each producing stream adds about one rollout to a Step
    wait_until(lambda: not steps.depth, WAIT_S, "the first rollouts trained")
    clock.now += 1.0
    stream(steps, seats[0], "a1", 3)
    stream(steps, seats[1], "b1", 3)
    wait_until(lambda: not steps.depth, WAIT_S, "a Step of both streams' rollouts")
    assert trainer.steps[-1] == ["a1", "b1"]
    clock.now += 1.0 + 0.5 + MAX_GRACE_S  # past each one's pace and grace: both stopped
    assert steps.step_columns() == 2
    for seat in seats + idle:
        seat.close()
    steps.close()


def test_a_stream_that_stops_holds_a_step_back_until_its_grace_alone() -> None:
    trainer = Recorder()
    clock = Clock()
    steps = queue(trainer, base=2, clock=clock)
    fast, stopping = steps.open_seat(2), steps.open_seat(2)
    for round_ in range(3):  # both at a rollout a second
        clock.now += 1.0
        stream(steps, fast, f"f{round_}", 2)
        stream(steps, stopping, f"s{round_}", 2)
        wait_until(lambda r=round_: len(trainer.steps) == r + 1, WAIT_S, "a Step of both")
    assert trainer.steps[-1] == ["f2", "s2"]
    clock.now += 1.0  # "stopping" was paused: its rollout is due now, and never comes
    stream(steps, fast, "f3", 2)
    clock.now += 0.5  # its grace: pace / 2; still waited for
    stream_was_waited_for = len(trainer.steps) == 3
    clock.now += 0.01  # past it: the Step goes without it
    wait_until(lambda: len(trainer.steps) == 4, WAIT_S, "the Step without the stopped stream")
    assert stream_was_waited_for and trainer.steps[-1] == ["f3"]
    assert steps.step_columns() == 2
    stream(steps, stopping, "s3", 2)  # back: it counts again
    assert steps.step_columns() == 4
    for seat in (fast, stopping):
        seat.close()
    steps.close()


def test_a_far_slower_stream_does_not_size_steps_but_its_rollouts_join_them() -> None:
    trainer = Recorder()
    clock = Clock()
    steps = queue(trainer, base=1, clock=clock)
    fast = [steps.open_seat(1) for _ in range(2)]
    slow = steps.open_seat(1)
    for second in range(1, 21):
        clock.now += 1.0
        for index, seat in enumerate(fast):
            stream(steps, seat, f"f{index}.{second}", 1)
        if second % 10 == 0:  # a tenth of the others' pace
            stream(steps, slow, f"slow{second}", 1)
        # Counted in, the slow stream would hold each Step back for its rollout: two queued.
        wait_until(lambda: steps.depth <= 1, WAIT_S, "the round's Steps without the slow one")
    assert steps.step_columns() == 2  # the fast ones alone
    for name in ("slow10", "slow20"):  # its rollouts joined Steps gathered with the fast ones'
        assert any(name in step and len(step) == 2 for step in trainer.steps), trainer.steps
    for seat in (*fast, slow):
        seat.close()
    steps.close()


def test_a_step_starts_when_every_producing_stream_waits() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=100)
    seats = [steps.open_seat(1), steps.open_seat(1)]
    stream(steps, seats[0], "a", 1)
    with seats[0].waiting():
        stream(steps, seats[1], "b", 1)
        assert not trainer.entered.is_set()  # "b"'s stream may send more
        with seats[1].waiting():  # a synchronous stream's wait for its Step: nothing comes
            wait_until(lambda: trainer.steps, WAIT_S, "a partial Step")
    assert trainer.steps == [["a", "b"]]
    for seat in seats:
        seat.close()
    steps.close()


def test_a_step_starts_after_the_oldest_rollouts_longest_wait() -> None:
    trainer = Recorder()
    clock = Clock()
    steps = queue(trainer, base=100, max_wait_s=30.0, clock=clock)
    seat = steps.open_seat(1)
    clock.now += 60.0
    future = stream(steps, seat, "a", 1)  # a rollout a minute: still due after max_wait_s
    clock.now += 29.0
    assert not future.done()
    clock.now += 1.0
    assert future.result(WAIT_S) == "a" and trainer.steps == [["a"]]
    seat.close()
    steps.close()


def test_other_layouts_and_requests_own_steps_are_not_gathered() -> None:
    trainer = Recorder()
    trainer.gate.clear()  # the first Step holds the worker while the rest queue up
    steps = queue(trainer, base=4)
    seat, other = steps.open_seat(4), steps.open_seat(1)
    stream(steps, seat, "first", 4)
    assert trainer.entered.wait(WAIT_S)
    stream(steps, seat, "a", 1)
    own(steps, "own")
    stream(steps, other, "other layout", 1, layout=(9, 6, False, None))
    stream(steps, seat, "b", 3)
    trainer.gate.set()
    seat.close()
    other.close()
    wait_until(lambda: len(trainer.steps) == 4, WAIT_S, "four Steps")
    # "own" first: its client had no Step yet, the stream's just had one
    assert trainer.steps[:2] == [["first"], ["own"]]
    assert sorted(trainer.steps[2:]) == [["a", "b"], ["other layout"]]
    steps.close()


def test_a_request_joins_the_step_of_the_streams_producing_its_layout() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=4)
    seat = steps.open_seat(2)
    own(steps, "alone", 2, layout=LAYOUT)  # no stream has sent one yet: a Step of its own
    wait_until(lambda: trainer.steps, WAIT_S, "the request's own Step")
    stream(steps, seat, "a", 2)  # the stream is producing now: its Step waits for 4 columns
    request = own(steps, "joins", 2, layout=LAYOUT)  # and the request fills it
    assert request.result(WAIT_S) == "joins"
    assert trainer.steps == [["alone"], ["a", "joins"]]
    seat.close()
    steps.close()


def test_clients_take_turns_however_many_rollouts_one_has_queued() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, base=4)
    seat = steps.open_seat(4)  # each of its rollouts a full Step
    stream(steps, seat, "s0", 4)
    assert trainer.entered.wait(WAIT_S)
    for name in ("s1", "s2"):  # the stream's next rollouts, queued while s0 trains
        stream(steps, seat, name, 4)
    own(steps, "u0")  # one Step of a client that sends one at a time, after them
    trainer.gate.set()
    seat.close()
    wait_until(lambda: len(trainer.steps) == 4, WAIT_S, "every Step")
    assert trainer.steps == [["s0"], ["u0"], ["s1"], ["s2"]]
    steps.close()


def test_a_request_beside_streams_with_rollouts_piled_up_is_in_the_next_step() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, base=4)
    a, b = steps.open_seat(2), steps.open_seat(2)
    stream(steps, a, "a1", 2)
    stream(steps, b, "b1", 2)  # a full Step, held in the trainer while the rest queue
    assert trainer.entered.wait(WAIT_S)
    for name in ("a2", "a3"):
        stream(steps, a, name, 2)
    for name in ("b2", "b3"):
        stream(steps, b, name, 2)
    request = own(steps, "u", 2, layout=LAYOUT)  # one at a time, after the streams' two each
    trainer.gate.set()
    assert request.result(WAIT_S) == "u"
    for seat in (a, b):
        seat.close()
    wait_until(lambda: len(trainer.steps) == 4, WAIT_S, "every Step")
    assert trainer.steps == [["a1", "b1"], ["u", "a2"], ["b2", "a3"], ["b3"]]
    steps.close()


def test_a_client_sending_requests_as_fast_as_answered_sizes_steps_like_a_stream() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    clock = Clock()
    steps = queue(trainer, base=2, clock=clock)
    a, b = steps.open_seat(2), steps.open_seat(2)
    clock.now += 1.0
    own(steps, "u0", 2, layout=LAYOUT)  # no stream produces yet: a Step of its own, held
    assert trainer.entered.wait(WAIT_S)
    stream(steps, a, "a0", 2)
    stream(steps, b, "b0", 2)
    assert steps.step_columns(LAYOUT) == 4  # one request says nothing of the next
    clock.now += 1.0
    u1 = own(steps, "u1", 2, layout=LAYOUT)  # its second, a second later: it is producing
    stream(steps, a, "a1", 2)
    stream(steps, b, "b1", 2)
    assert steps.step_columns(LAYOUT) == 6
    trainer.gate.set()
    assert u1.result(WAIT_S) == "u1"
    # the request takes no stream's place, and the next Step waits for its next request
    assert trainer.steps == [["u0"], ["a0", "b0", "u1"]]
    clock.now += 1.0
    for name in ("a2", "a3"):  # the streams' rollouts pile up behind a busy learner...
        stream(steps, a, name, 2)
    for name in ("b2", "b3"):
        stream(steps, b, name, 2)
    own(steps, "u2", 2, layout=LAYOUT).result(WAIT_S)
    # ...and no stream's second rollout takes the place of the request client's next
    assert trainer.steps[2] == ["a1", "b1", "u2"]
    clock.now += 1.0
    own(steps, "u3", 2, layout=LAYOUT).result(WAIT_S)
    assert trainer.steps[3] == ["a2", "b2", "u3"]
    clock.now += 1.0 + 0.5 + 0.01  # past the request client's pace and grace: it stopped
    stream(steps, a, "a4", 2)  # while the streams go on
    stream(steps, b, "b4", 2)
    assert steps.step_columns(LAYOUT) == 4
    wait_until(lambda: len(trainer.steps) == 6, WAIT_S, "the streams' Steps without it")
    assert trainer.steps[4:] == [["a3", "b3"], ["a4", "b4"]]
    for seat in (a, b):
        seat.close()
    steps.close()


def test_a_step_that_may_start_does_not_wait_behind_one_still_gathering() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=4)
    seat, other = steps.open_seat(2), steps.open_seat(4)
    gathering = stream(steps, seat, "a", 2)  # half a Step, its stream producing: it waits
    own(steps, "own")  # a request's own Step: it may start at once
    stream(steps, other, "full, other layout", 4, layout=(9, 6, False, None))
    wait_until(lambda: len(trainer.steps) == 2, WAIT_S, "the Steps that may start")
    assert trainer.steps == [["own"], ["full, other layout"]] and not gathering.done()
    stream(steps, seat, "b", 2)
    assert gathering.result(WAIT_S) == "a" and trainer.steps[-1] == ["a", "b"]
    for each in (seat, other):
        each.close()
    steps.close()


def test_every_client_may_have_one_queued_and_further_ones_wait_in_line_or_are_refused() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, capacity=1, base=4)
    seats = [steps.open_seat(4), steps.open_seat(4)]
    stream(steps, seats[0], "training", 4)
    assert trainer.entered.wait(WAIT_S)
    stream(steps, seats[0], "queued", 4)  # the shared room: one Step's worth, now full
    stream(steps, seats[1], "other stream", 4)  # its first: in, full or not
    first = own(steps, "unary", 1)  # a request's client's first: in too
    with pytest.raises(QueueFull) as refused:
        own(steps, "unary again", 1)  # its second, with the queue full: refused at once
    message = str(refused.value)
    for said in ("step queue full", "hold 9 environment columns of its room for 8",
                 "server.step_queue_size = 1 x a Step of 8 columns",
                 "this client already has 1 queued"):  # fmt: skip
        assert said in message, message
    own(steps, "another client's", 1, client="another")

    order: list[str] = []

    def later(seat: Seat, name: str) -> None:
        stream(steps, seat, name, 4)
        order.append(name)

    waiters = [threading.Thread(target=later, args=(seats[0], "waited first"))]
    waiters[0].start()
    wait_until(lambda: len(steps._line) == 1, WAIT_S, "the first stream waiting for room")
    waiters.append(threading.Thread(target=later, args=(seats[1], "waited second")))
    waiters[1].start()
    wait_until(lambda: len(steps._line) == 2, WAIT_S, "the second in line")
    with pytest.raises(QueueFull, match="2 streams' rollouts wait for room before it"):
        own(steps, "unary again", 1)
    assert not order  # no room while the queued Steps wait
    trainer.gate.set()  # Steps go: room
    for waiter in waiters:
        waiter.join(WAIT_S)
    assert sorted(order) == ["waited first", "waited second"]
    assert first.result(WAIT_S) == "unary"
    for seat in seats:
        seat.close()
    steps.close()


def test_a_stream_whose_caller_left_stops_waiting_for_room() -> None:
    trainer = Recorder()
    trainer.gate.clear()
    steps = queue(trainer, capacity=1, base=4)
    seat = steps.open_seat(4)
    stream(steps, seat, "training", 4)
    assert trainer.entered.wait(WAIT_S)
    stream(steps, seat, "queued", 4)  # its first in the queue, which fills the room
    left = threading.Event()
    with pytest.raises(Abandoned):
        stream(steps, seat, "never", 4, waiting=left.is_set)
    trainer.gate.set()
    seat.close()
    steps.close()


def test_a_caller_that_left_is_dropped_from_its_step_alone() -> None:
    trainer = Recorder()
    steps = queue(trainer, base=3)
    seat = steps.open_seat(3)
    gone = stream(steps, seat, "gone", 1, waiting=lambda: False)
    kept = [stream(steps, seat, name, 1) for name in "ab"]
    assert [future.result(WAIT_S) for future in kept] == ["a", "b"]
    with pytest.raises(Abandoned):
        gone.result(WAIT_S)
    assert trainer.steps == [["a", "b"]]
    seat.close()
    steps.close()


def test_the_grace_is_bounded() -> None:
    steps = queue(Recorder())
    seat = Seat(steps, 1, opened=0.0)
    assert seat.due_until(step_s=0.0) == float("-inf")  # no rollout yet: not producing
    seat.arrived(0.001, LAYOUT)  # a first rollout at once: the least grace
    assert seat.due_until(step_s=0.0) == pytest.approx(0.001 + 0.001 + MIN_GRACE_S)
    for _ in range(5):  # a slow stream: at most MAX_GRACE_S past its pace
        seat.arrived(seat.latest + 30.0, LAYOUT)  # type: ignore[operator]
    assert seat.due_until(step_s=0.25) == pytest.approx(seat.latest + 30.0 + MAX_GRACE_S + 0.25)
    steps.close()


def submit_all(steps: StepQueue, count: int) -> list:
    return [own(steps, index, client=f"client {index}") for index in range(count)]


def test_close_applies_what_starts_within_grace_and_refuses_the_rest() -> None:
    trainer = Recorder()
    trainer.gate.clear()  # the first Step holds the worker until close() has set its deadline
    clock = Clock()
    steps = queue(trainer, capacity=3, clock=clock)
    futures = submit_all(steps, 1)
    assert trainer.entered.wait(WAIT_S), "the worker never started the first Step"
    futures += [own(steps, index, columns=4, client="one") for index in (1, 2, 3)]
    closer = threading.Thread(target=steps.close, args=(0.0,))
    closer.start()
    wait_until(lambda: refused(steps), WAIT_S, "close() refusing new Steps")
    clock.now += 1.0  # past the grace
    trainer.gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert futures[0].result(0) == 0 and trainer.steps == [[0]]
    for future in futures[1:]:
        with pytest.raises(Unavailable, match="grace ran out"):
            future.result(0)


def refused(steps: StepQueue) -> bool:
    """Whether a new Step is refused as draining (the probe is never accepted: its client's
    Steps fill the queue until close() refuses)."""
    try:
        own(steps, 9, client="one")
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
    stream(steps, seat, "partial", 1)
    steps.close()
    assert [future.result(0) for future in futures] == list(range(8))
    assert trainer.steps == [[k] for k in range(8)] + [["partial"]]
    seat.close()
