"""The learner's queue: rollouts in, Steps of the learner's size out, applied one at a time, in
arrival order, by one worker thread (SEED RL's learner batch, Sample Factory's Batcher).

A Step is the learner's, not a request's: the rollouts of Interact streams (gathered jobs) are
taken whole, in arrival order, side by side into one Step of `step_columns` environment
columns; a request's own Step (a unary Step, StreamStep) is applied alone. The size is
`max(base, the columns of the streams open now)`: at least the configured one (train.num_envs),
and large enough that every stream adds about one rollout per Step, so that a rollout is at
most a Step or two behind the policy that trains on it however many actors there are.

A Step starts as soon as one of these holds:
- its columns are in: the gathered rollouts fill it, or the next one of its layout would not
  fit (a rollout larger than a Step is a Step of its own);
- nothing more can come: every open stream waits (for its own Steps, or for room), or none is
  open;
- the oldest rollout has waited `max_wait_s` (a Step then takes the whole rollouts that have
  arrived);
- the queue is closing (a drain applies what is queued without waiting for more).

Backpressure, not blocking: `submit` on a full queue raises QueueFull at once; a stream's
rollouts wait for room instead (`wait_for_room`), so its actor slows down and nothing is lost.
The queue holds `capacity` Steps' worth of columns (a request's own Step counts as a whole
Step). A job whose caller has gone by the time its Step starts is dropped before it touches the
trainer, so a Step is applied whole or not at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.errors import Abandoned, QueueFull, Unavailable
from service.types import StepResult

Work = TypeVar("Work")  # what one rollout brings: the engine's rollout with its key
ROOM_POLL_S = 0.1  # a stream waiting for room re-checks that its caller is still there


@dataclass(eq=False)
class _Job(Generic[Work]):
    work: Work
    caller_waiting: Callable[[], bool]
    columns: int
    layout: Hashable | None  # None: a Step of its own; else gathered with jobs of this layout
    weight: int  # the columns it holds of the queue's capacity
    future: Future[StepResult] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)


class Seat:
    """An Interact stream's place at the queue: its columns count towards a Step's size, and
    while it waits (`waiting()`) a Step does not wait for it."""

    def __init__(self, queue: StepQueue, columns: int) -> None:
        self._queue, self.columns = queue, columns

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The stream sends nothing until the block ends."""
        self._queue._seat_waits(self, +1)
        try:
            yield
        finally:
            self._queue._seat_waits(self, -1)

    def close(self) -> None:
        self._queue._seat_leaves(self)


# What a Step's worker hands to `apply`: each rollout's work and its time in the queue (ms).
Taken = list[tuple[Work, float]]
Apply = Callable[[Taken], list["StepResult | Exception"]]


class StepQueue(Generic[Work]):
    def __init__(
        self,
        apply: Apply,
        capacity: int,
        max_wait_s: float,
        base_columns: Callable[[], int],
    ) -> None:
        """`apply` trains one Step on the rollouts it is given and returns, per rollout, its
        result or the error that refused it; `capacity` is in Steps' worth of columns."""
        self._apply = apply
        self._capacity = capacity
        self._max_wait_s = max_wait_s
        self._base_columns = base_columns
        self._jobs: list[_Job[Work]] = []
        self._held = 0  # columns of the queued jobs' weights
        self._seats: dict[Seat, int] = {}  # open streams -> how many of their waits are on
        self._accepting = True
        self._deadline = float("inf")  # perf_counter time after which queued Steps are refused
        self._cond = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="trident-steps", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------------ callers
    def step_columns(self) -> int:
        """The columns of a gathered Step now: the base, or more while the open streams hold
        more."""
        with self._cond:
            return self._step_columns()

    def open_seat(self, columns: int) -> Seat:
        seat = Seat(self, columns)
        with self._cond:
            self._seats[seat] = 0
            self._cond.notify_all()
        return seat

    def submit(
        self,
        work: Work,
        caller_waiting: Callable[[], bool],
        columns: int,
        layout: Hashable | None = None,
        must_fit: bool = True,
    ) -> Future[StepResult]:
        """Queue `work` (a rollout of `columns` environments; with a `layout`, gathered with
        others of that layout). QueueFull at once when it does not fit and `must_fit`;
        Unavailable once the queue is closing."""
        with self._cond:
            self._check_accepting()
            weight = columns if layout is not None else max(columns, self._step_columns())
            if must_fit and not self._fits(weight):
                raise QueueFull(
                    f"step queue: expected room for {weight} environment columns, got "
                    f"{self._held} of {self._capacity} Steps' worth "
                    f"({self._capacity * self._step_columns()} columns, server.step_queue_size) "
                    "held; retry later"
                )
            job = _Job(work, caller_waiting, columns, layout, weight)
            self._jobs.append(job)
            self._held += weight
            self._cond.notify_all()
        return job.future

    def wait_for_room(self, columns: int, caller_waiting: Callable[[], bool], seat: Seat) -> None:
        """Return once `columns` fit in the queue (the caller then submits without
        `must_fit`); Abandoned when the caller leaves first, Unavailable when the queue
        closes. The seat counts as waiting meanwhile."""
        with seat.waiting(), self._cond:
            while True:
                self._check_accepting()
                if self._fits(columns):
                    return
                if not caller_waiting():
                    raise Abandoned("caller left while its rollout waited for room in the queue")
                self._cond.wait(ROOM_POLL_S)

    @property
    def open_streams(self) -> int:
        """Interact streams holding a seat now."""
        with self._cond:
            return len(self._seats)

    @property
    def depth(self) -> int:
        """Rollouts and requests' Steps waiting to be applied."""
        return len(self._jobs)

    def close(self, grace_s: float = float("inf")) -> None:
        """Stop accepting, let the worker apply queued Steps for up to `grace_s`, and wait for
        it. A Step still queued when the grace runs out is answered UNAVAILABLE, never applied,
        so its caller can send it again elsewhere."""
        with self._cond:
            self._accepting = False
            self._deadline = time.perf_counter() + grace_s
            self._cond.notify_all()
        self._worker.join()

    # ------------------------------------------------------------------------ state
    def _check_accepting(self) -> None:
        if not self._accepting:
            raise Unavailable("the server is draining and takes no new Steps")

    def _step_columns(self) -> int:
        return max(self._base_columns(), sum(seat.columns for seat in self._seats))

    def _fits(self, weight: int) -> bool:
        return not self._jobs or self._held + weight <= self._capacity * self._step_columns()

    def _seat_waits(self, seat: Seat, change: int) -> None:
        with self._cond:
            if seat in self._seats:
                self._seats[seat] += change
                self._cond.notify_all()

    def _seat_leaves(self, seat: Seat) -> None:
        with self._cond:
            self._seats.pop(seat, None)
            self._cond.notify_all()

    # ------------------------------------------------------------------------ the worker
    def _gather(self) -> tuple[list[_Job[Work]], bool]:
        """The next Step's jobs from the head of the queue, and whether it is full."""
        head = self._jobs[0]
        if head.layout is None:
            return [head], True
        size = self._step_columns()
        batch: list[_Job[Work]] = []
        columns = 0
        for job in self._jobs:
            if job.layout != head.layout:
                continue
            if batch and columns + job.columns > size:
                return batch, True  # the next rollout would not fit: this Step is full
            batch.append(job)
            columns += job.columns
            if columns >= size:
                return batch, True
        return batch, False

    def _next_step(self) -> list[_Job[Work]] | None:
        """Wait for the next Step's jobs and take them out of the queue; None once the queue
        is closed and empty. Called with the condition held."""
        while True:
            if not self._jobs:
                if not self._accepting:
                    return None
                self._cond.wait()
                continue
            batch, full = self._gather()
            due = self._jobs[0].enqueued + self._max_wait_s
            now = time.perf_counter()
            idle = all(waits > 0 for waits in self._seats.values())  # nothing more can come
            if full or idle or not self._accepting or now >= due:
                taken = set(map(id, batch))
                self._jobs = [job for job in self._jobs if id(job) not in taken]
                self._held -= sum(job.weight for job in batch)
                self._cond.notify_all()  # room for the streams waiting for it
                return batch
            self._cond.wait(due - now)

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._next_step()
            if batch is None:
                return
            started = time.perf_counter()
            live = []
            for job in batch:
                if not job.caller_waiting():
                    job.future.set_exception(Abandoned("caller left before the Step started"))
                elif started > self._deadline:
                    job.future.set_exception(
                        Unavailable("the server's shutdown grace ran out before this Step started")
                    )
                else:
                    live.append(job)
            if not live:
                continue
            try:
                outcomes = self._apply([(j.work, 1e3 * (started - j.enqueued)) for j in live])
            except Exception as error:  # delivered to the waiting handlers, which map it
                outcomes = [error] * len(live)
            for job, outcome in zip(live, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)
