"""The learner's queue: rollouts in, Steps of the learner's size out, applied one at a time by
one worker thread (SEED RL's learner batch, Sample Factory's Batcher).

What a Step holds. The rollouts of Interact streams are taken whole, side by side into one Step
of `step_columns` environment columns, in turn by client: each client's earliest queued rollout
first (the clients served longest ago first, then in arrival order), then each one's second,
and so on; a client's own rollouts keep their order. A second rollout takes no place kept for
a producing client (below) that has nothing queued yet: the Step waits for that client's
rollout, as for any producing stream's. A client with rollouts piled up behind a busy learner
thus takes no more of a Step than one with a single rollout queued, or one whose next is on
its way. A request's
rollout (a unary Step, StreamStep, a rollout an actor sends again) joins that Step while
streams of its layout are producing, and waits for it as their rollouts do: Steps keep the
streams' pace, so a client sending requests as fast as they are answered does not advance the
policy past the streams' gathering rollouts (a Step started for each request would, on a fast
learner, leave every stream's rollout more Steps behind than the policy lag allows), and taken
in turn by client it is in about every Step. With no stream of its layout producing, a
request's rollout is a Step of its own, as sent. Of the Steps that may start, the next is the
one whose first job's client was served longest ago, the earliest to arrive of those tied:
round-robin by client. The size is `max(base, the columns of the clients producing now)`: at
least the configured one (train.num_envs), and large enough that each producing stream (and
each client producing requests of the streams' layout) adds about one rollout per Step, so that
a rollout is a Step or two behind the policy that trains on it however many actors there are,
and a request's rollout takes no stream's place in the Step.

Which streams are producing. A stream counts from its first whole rollout on, for as long as
its next one is due: its pace (the median of its last PACE_SAMPLES intervals between rollouts;
before its second, the time its first took) plus a grace of pace / 2, within [MIN_GRACE_S,
MAX_GRACE_S], plus the latest Step's time (its rollout may have been due while a Step ran). A
stream that has sent no whole rollout (idle, or cancelled halfway), or has stopped (paused, not
reading its replies, gone quiet) counts for nothing, and so does one whose pace is more than
SLOW_FACTOR times the producing streams' median: its rollouts join the Steps that are gathering
and never hold one back. A client sending requests (its key's actor, else its connection) is
producing in the same way from its second request on, while its next is due by its own pace,
and it waits while a request of its is queued or in a Step: a client sending requests as fast
as they are answered is counted like a stream of its columns; one that sends now and then, or
stops, counts for nothing.

When a Step starts: as soon as one of these holds
- its columns are in: the gathered rollouts fill it, or the next one of its layout would not
  fit (a rollout larger than a Step is a Step of its own);
- nothing more is expected: every stream producing its layout waits (for room, or for its own
  Steps), or none does;
- its oldest rollout has waited `max_wait_s` (server.step_max_wait_ms);
- the queue is closing (a drain applies what is queued without waiting for more).
So an arrived rollout waits for producing streams alone: one that stops holds a Step back by at
most its grace (at most MAX_GRACE_S plus one Step's time) past when its rollout was due, and
nothing waits longer than `max_wait_s`.

Room. The queue holds `capacity` Steps' worth of columns (server.step_queue_size), and beyond
that every client (a stream; a request's client, its Step key's actor or else its connection)
may always have one rollout or Step queued: no client is starved by others keeping the queue
full. A request that does not fit is refused at once (QueueFull, RESOURCE_EXHAUSTED, saying what
is full); a stream's rollout waits for room instead (`wait_for_room`), in line behind the
streams' rollouts that waited before it, so its actor slows down and nothing is lost. A job
whose caller has gone by the time its Step starts is dropped before it touches the trainer, so
a Step is applied whole or not at all.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.errors import Abandoned, QueueFull, Unavailable
from service.types import StepResult

Work = TypeVar("Work")  # what one rollout brings: the learner's rollout with its key
ROOM_POLL_S = 0.1  # a wait for room, or for a stream's rollout, looks again this often
PACE_SAMPLES = 5  # a stream's pace: the median of its latest intervals between rollouts
MIN_GRACE_S = 0.1  # how late a stream's rollout may be before it stops counting, at least...
MAX_GRACE_S = 1.0  # ...and at most (besides the latest Step's time)
SLOW_FACTOR = 4.0  # a stream this many times slower than the median does not size Steps
FORGET_AFTER_STEPS = 1024  # a client with nothing queued and no Step in this many is forgotten
REQUESTER_MEMORY_S = 60.0  # a request client's pace is kept this long after its latest request


@dataclass(eq=False)
class _Job(Generic[Work]):
    work: Work
    caller_waiting: Callable[[], bool]
    columns: int
    layout: Hashable  # gathered with jobs of this layout (Rollout.layout)
    client: Hashable  # whose it is: a Seat, or a request's client
    enqueued: float  # the queue's clock when it joined
    future: Future[StepResult] = field(default_factory=Future)

    @property
    def request(self) -> bool:
        """A request's Step (not a stream's rollout): alone unless streams of its layout are
        producing."""
        return not isinstance(self.client, Seat)


class Seat:
    """An Interact stream's place at the queue: while it produces rollouts its columns count
    towards a Step's size, and while it waits (`waiting()`) a Step does not wait for it. Its
    fields are the queue's, read and written under the queue's lock."""

    def __init__(self, queue: StepQueue, columns: int, opened: float) -> None:
        self._queue, self.columns, self.opened = queue, columns, opened
        self.waits = 0  # how many of its waits are on
        self.layout: Hashable | None = None  # its rollouts', from the first on
        self.latest: float | None = None  # the queue's clock at its latest rollout
        self.intervals: deque[float] = deque(maxlen=PACE_SAMPLES)

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

    @property
    def client(self) -> Hashable:
        """Whose jobs in the queue are its rollouts."""
        return self

    def arrived(self, now: float, layout: Hashable) -> None:
        if self.latest is not None:
            self.intervals.append(now - self.latest)
        self.latest, self.layout = now, layout

    def pace(self) -> float:
        """Seconds between its rollouts; call once it has sent one."""
        assert self.latest is not None
        return statistics.median(self.intervals) if self.intervals else self.latest - self.opened

    def due_until(self, step_s: float) -> float:
        """When it stops counting as producing unless another rollout comes (`step_s`: the
        latest Step's time); -inf before its first rollout."""
        if self.latest is None:
            return float("-inf")
        pace = self.pace()
        return self.latest + pace + min(max(pace / 2, MIN_GRACE_S), MAX_GRACE_S) + step_s


class _Requester(Seat):
    """A request client's place: paced by its requests, from its second on (a single request
    says nothing of when the next comes), waiting while one of its requests is not answered."""

    def __init__(self, queue: StepQueue, client: Hashable, columns: int, opened: float) -> None:
        super().__init__(queue, columns, opened)
        self._client = client

    @property
    def client(self) -> Hashable:
        return self._client

    def due_until(self, step_s: float) -> float:
        return super().due_until(step_s) if self.intervals else float("-inf")

    def forgotten(self, now: float) -> bool:
        """Whether it has waited for nothing and sent nothing for REQUESTER_MEMORY_S."""
        return not self.waits and self.latest is not None and now - self.latest > REQUESTER_MEMORY_S


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
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`apply` trains one Step on the rollouts it is given and returns, per rollout, its
        result or the error that refused it; `capacity` is in Steps' worth of columns; `clock`
        (seconds) times the streams' paces and the rollouts' waits."""
        self._apply = apply
        self._clock = clock
        self._capacity = capacity
        self._max_wait_s = max_wait_s
        self._base_columns = base_columns
        self._jobs: list[_Job[Work]] = []
        self._held = 0  # columns of the queued jobs
        self._held_by: Counter[Hashable] = Counter()  # queued jobs per client
        self._line: deque[object] = deque()  # streams' rollouts waiting for room, in order
        self._seats: set[Seat] = set()
        self._requesters: dict[Hashable, _Requester] = {}  # request clients, while producing
        self._served: dict[Hashable, int] = {}  # client -> the latest Step taken with its job
        self._steps_taken = 0
        self._step_s = 0.0  # how long the latest Step took
        self._accepting = True
        self._deadline = float("inf")  # the clock's time after which queued Steps are refused
        self._cond = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="trident-steps", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------------ callers
    def step_columns(self, layout: Hashable | None = None) -> int:
        """The columns of a gathered Step now: the base, or more while the streams producing
        (rollouts of `layout`; None: of any) hold more."""
        with self._cond:
            return self._step_columns(self._producing(self._clock()), layout)

    def open_seat(self, columns: int) -> Seat:
        seat = Seat(self, columns, self._clock())
        with self._cond:
            self._seats.add(seat)
        return seat

    def submit(
        self,
        work: Work,
        caller_waiting: Callable[[], bool],
        columns: int,
        client: Hashable,
        layout: Hashable,
        must_fit: bool = True,
    ) -> Future[StepResult]:
        """Queue `work` of `client` (a Seat, or a request's client): a rollout of `columns`
        environments, gathered with others of its `layout`. QueueFull at once when it does not
        fit and `must_fit`; Unavailable once the queue is closing."""
        with self._cond:
            self._check_accepting()
            if must_fit and not self._admits(client, columns, in_line=not self._line):
                raise QueueFull(self._full(client, columns))
            job = _Job(work, caller_waiting, columns, layout, client, self._clock())
            self._jobs.append(job)
            self._held += columns
            self._held_by[client] += 1
            if job.request:
                self._request_arrived(job)
            self._cond.notify_all()
        return job.future

    def wait_for_room(
        self, seat: Seat, columns: int, layout: Hashable, caller_waiting: Callable[[], bool]
    ) -> None:
        """A rollout of the stream's is whole: note its pace, and return once the rollout fits
        (the caller then submits it without `must_fit`), in line behind the streams' rollouts
        that waited before it. Abandoned when the caller leaves first, Unavailable when the
        queue closes. The seat counts as waiting meanwhile."""
        ticket = object()
        with seat.waiting(), self._cond:
            seat.arrived(self._clock(), layout)
            self._cond.notify_all()
            self._line.append(ticket)
            try:
                while True:
                    self._check_accepting()
                    if self._admits(seat, columns, in_line=self._line[0] is ticket):
                        return
                    if not caller_waiting():
                        raise Abandoned("caller left while its rollout waited for room")
                    self._cond.wait(ROOM_POLL_S)
            finally:
                self._line.remove(ticket)
                self._cond.notify_all()

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
            self._deadline = self._clock() + grace_s
            self._cond.notify_all()
        self._worker.join()

    # ------------------------------------------------------------------------ state
    def _check_accepting(self) -> None:
        if not self._accepting:
            raise Unavailable("the server is draining and takes no new Steps")

    def _request_arrived(self, job: _Job[Work]) -> None:
        """Note a request's pace; its client waits until the request is answered."""
        requester = self._requesters.get(job.client)
        if requester is None:
            requester = _Requester(self, job.client, job.columns, job.enqueued)
            self._requesters[job.client] = requester
        requester.columns = job.columns
        requester.arrived(job.enqueued, job.layout)
        requester.waits += 1
        job.future.add_done_callback(lambda _: self._seat_waits(requester, -1))

    def _producing(self, now: float) -> list[Seat]:
        """The streams and request clients whose rollouts size a Step now: those whose next
        rollout is due, less those far slower than their median. A request client that sent
        nothing for REQUESTER_MEMORY_S is forgotten."""
        self._requesters = {client: requester for client, requester in self._requesters.items()
                            if not requester.forgotten(now)}  # fmt: skip
        seats = [*self._seats, *self._requesters.values()]
        due = [seat for seat in seats if now <= seat.due_until(self._step_s)]
        if len(due) < 2:
            return due
        median = statistics.median(seat.pace() for seat in due)
        return [seat for seat in due if seat.pace() <= SLOW_FACTOR * median]

    def _step_columns(self, producing: list[Seat], layout: Hashable | None) -> int:
        streams = sum(seat.columns for seat in producing if layout in (None, seat.layout))
        return max(self._base_columns(), streams)

    def _room_columns(self) -> int:
        """The columns the queue holds before a client's second job must wait or is refused."""
        return self._capacity * self._step_columns(self._producing(self._clock()), None)

    def _admits(self, client: Hashable, columns: int, in_line: bool) -> bool:
        """Whether `client`'s job of `columns` may join the queue now: its first always, a
        further one where it fits and it is first in line for room."""
        if not self._held_by[client]:
            return True
        return in_line and self._held + columns <= self._room_columns()

    def _full(self, client: Hashable, columns: int) -> str:
        room = self._room_columns()
        waiting = len(self._line)
        line = f"; {waiting} streams' rollouts wait for room before it" if waiting else ""
        return (
            f"step queue full: {len(self._jobs)} queued rollouts and Steps hold {self._held} "
            f"environment columns of its room for {room} (server.step_queue_size = "
            f"{self._capacity} x a Step of {room // self._capacity} columns){line}, and this "
            f"client already has {self._held_by[client]} queued; expected room for {columns} "
            "more columns: send it again once an earlier one is answered, or raise "
            "server.step_queue_size"
        )

    def _seat_waits(self, seat: Seat, change: int) -> None:
        with self._cond:
            seat.waits += change
            self._cond.notify_all()

    def _seat_leaves(self, seat: Seat) -> None:
        with self._cond:
            self._seats.discard(seat)
            self._cond.notify_all()

    # ------------------------------------------------------------------------ the worker
    def _gather(self, layout: Hashable, size: int, requests: bool, reserved: int
                ) -> tuple[list[_Job[Work]], bool]:  # fmt: skip
        """The jobs of `layout`'s next Step (with `requests`: requests' too), in turn by client,
        and whether it is full. `reserved` columns are kept for the producing clients with
        nothing queued yet: only clients' first rollouts take them."""
        batch: list[_Job[Work]] = []
        columns = 0
        for first, job in self._in_turn(layout, requests):
            if batch and columns + job.columns > size:
                return batch, True  # the next rollout would not fit: this Step is full
            if not first and columns + job.columns > size - reserved:
                return batch, False  # a second rollout would take an expected client's place
            batch.append(job)
            columns += job.columns
            if columns >= size:
                return batch, True
        return batch, False

    def _in_turn(self, layout: Hashable, requests: bool) -> list[tuple[bool, _Job[Work]]]:
        """The queued jobs of `layout` (with `requests`: requests' too) in turn by client: every
        client's first, those served longest ago first and then by arrival, then every client's
        second, and so on; each with whether it is its client's first."""
        turn: Counter[Hashable] = Counter()
        ranked = []
        for arrival, job in enumerate(self._jobs):
            if job.layout != layout or (job.request and not requests):
                continue
            ranked.append((turn[job.client], self._served.get(job.client, -1), arrival, job))
            turn[job.client] += 1
        return [(turn == 0, job) for turn, *_, job in sorted(ranked, key=lambda rank: rank[:3])]

    def _ready(self, now: float) -> tuple[list[_Job[Work]] | None, float]:
        """Of the Steps that may start now (a request's own Step may at once), the one whose
        first job's client was served longest ago (the earliest to arrive of those tied), and
        else when to look again."""
        producing = self._producing(now)
        # requests of these layouts join streams' Steps
        streamed = {seat.layout for seat in producing if not isinstance(seat, _Requester)}
        wake, seen = float("inf"), set()
        chosen: tuple[int, list[_Job[Work]]] | None = None
        for head in self._jobs:
            if head.request and head.layout not in streamed:
                batch = [head]
            elif head.layout in seen:
                continue
            else:
                seen.add(head.layout)
                size = self._step_columns(producing, head.layout)
                expected = [s for s in producing if s.layout == head.layout and not s.waits]
                queued = {job.client for job in self._jobs if job.layout == head.layout}
                reserved = sum(s.columns for s in expected if s.client not in queued)
                batch, full = self._gather(head.layout, size, head.layout in streamed, reserved)
                due = head.enqueued + self._max_wait_s
                if not (full or not expected or not self._accepting or now >= due):
                    wake = min(wake, due, *(seat.due_until(self._step_s) for seat in expected))
                    continue
            served = self._served.get(head.client, -1)
            if chosen is None or served < chosen[0]:
                chosen = (served, batch)
        return (None if chosen is None else chosen[1]), wake

    def _next_step(self) -> list[_Job[Work]] | None:
        """Wait for the next Step's jobs and take them out of the queue; None once the queue
        is closed and empty. Called with the condition held."""
        while True:
            if not self._jobs:
                if not self._accepting:
                    return None
                self._cond.wait()
                continue
            now = self._clock()
            batch, wake = self._ready(now)
            if batch is not None:
                taken = set(map(id, batch))
                self._jobs = [job for job in self._jobs if id(job) not in taken]
                self._held -= sum(job.columns for job in batch)
                self._held_by.subtract(job.client for job in batch)
                self._held_by = +self._held_by  # a client with nothing queued leaves no entry
                self._note_served(batch)
                self._cond.notify_all()  # room for the streams waiting for it
                return batch
            self._cond.wait(min(max(wake - now, 1e-3), ROOM_POLL_S))

    def _note_served(self, batch: list[_Job[Work]]) -> None:
        """Count a Step for its clients; forget those with nothing queued that no Step of the
        last FORGET_AFTER_STEPS served (memory stays with the clients seen lately)."""
        self._steps_taken += 1
        for job in batch:
            self._served[job.client] = self._steps_taken
        if self._steps_taken % FORGET_AFTER_STEPS == 0:
            recent = self._steps_taken - FORGET_AFTER_STEPS
            self._served = {client: step for client, step in self._served.items()
                            if step > recent or self._held_by[client]}  # fmt: skip

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._next_step()
            if batch is None:
                return
            started = self._clock()
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
            with self._cond:
                self._step_s = self._clock() - started
            for job, outcome in zip(live, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)
