"""The learner process's side of the front-end processes: `LearnerHub` serves a handoff `Hub`
from the `Engine`, the mirror of `learner_proxy` in each front end.

The hub's reader thread must never block, so each of its callbacks returns at once:
- an Act goes to the batched Act (`Engine.submit_act`), whose Future answers it;
- a rollout goes to the Engine's `submit_step` (a request's) or its stream's seat on a small
  pool of threads (`rollouts`), one for every rollout slot of every front end: a seat's wait
  for room in the Step queue holds one of them, never the reader;
- a SEAT message opens, waits, resumes or closes the stream's seat (`Engine.open_seat`); a
  closed seat's rollouts still waiting for room are abandoned;
- a control call runs on the hub's call threads, dispatched by name (`learner_calls`).

A front end that is gone has its seats closed; its rollouts read `alive() == False`, so the
Step queue drops those not yet started (counted as abandoned), and nothing is applied twice:
its actors send them again, keyed, through another front end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from service import logs
from service.errors import InvalidInput
from service.handoff import Delivery, HandoffLimits, Hub
from service.handoff.channel import SeatOp
from service.server import learner_calls as calls
from service.server.engine import Engine
from service.server.learner import StreamSeat
from service.step_ledger import StepKey
from service.types import StepResult


class _RemoteSeat:
    """A front end's stream's seat, and the waits it has begun (SEAT WAIT) and not ended."""

    def __init__(self, seat: StreamSeat) -> None:
        self.seat = seat
        self.waits: list[AbstractContextManager[None]] = []
        self.closed = False


class LearnerHub:
    """Serves front ends' Acts, rollouts, seats and calls from `engine`; `limits` bound their
    slots, `front_ends` is how many may be connected at once (the rollout threads' count).
    `on_call(front_end, name, args)` answers the calls that are no engine's (ready, metrics,
    admission), None where it has none; those named in `inline` must return at once (they are
    answered on the hub's reader thread). `on_gone(front_end)` hears of each front end gone."""

    def __init__(
        self,
        engine: Engine,
        limits: HandoffLimits,
        front_ends: int,
        on_call: Callable[[int, str, Any], Any] | None = None,
        inline: frozenset[str] = frozenset(),
        on_gone: Callable[[int], None] = lambda front_end: None,
    ) -> None:
        self.engine, self._on_call, self._on_gone = engine, on_call, on_gone
        self._rollouts = ThreadPoolExecutor(max(1, front_ends * limits.rollout_slots),
                                            thread_name_prefix="trident-rollouts")  # fmt: skip
        self._seats: dict[tuple[int, int], _RemoteSeat] = {}
        self._lock = threading.Lock()
        self.hub = Hub(limits, engine.submit_act, self._step, self._call, self._gone,
                       name="trident-handoff", seat=self._seat, inline=inline)  # fmt: skip

    def listen(self, path: str) -> None:
        self.hub.listen(path)

    def close(self) -> None:
        """Close the hub (every front end's waiters fail) and the rollout threads."""
        self.hub.close()
        self._rollouts.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------ rollouts
    def _step(self, delivery: Delivery) -> Future[StepResult]:
        key = None if delivery.actor is None else StepKey(delivery.actor, delivery.sequence)
        if delivery.stream == 0:
            client = delivery.client or f"front end {delivery.front_end}"
            return self._off_reader(delivery, lambda: self.engine.submit_step(
                delivery.rollout, delivery.alive, key, client=client))  # fmt: skip
        with self._lock:
            remote = self._seats.get((delivery.front_end, delivery.stream))
        if remote is None or key is None:
            raise InvalidInput("handoff.stream", "a keyed rollout of a stream whose seat is open",
                               f"stream {delivery.stream}")  # fmt: skip
        self.engine.require_training("Interact")

        def waiting() -> bool:
            return delivery.alive() and not remote.closed

        return self._off_reader(delivery,
                                lambda: remote.seat.submit(delivery.rollout, waiting, key))

    def _off_reader(self, delivery: Delivery, submit: Callable[[], Future[StepResult]]
                    ) -> Future[StepResult]:  # fmt: skip
        """`submit()` on a rollout thread; its Future's outcome, in one Future returned now.
        The front end hears when it is queued (a stream's next rollout waits for that, as a
        stream waits for room in one process)."""
        answer: Future[StepResult] = Future()

        def run() -> None:
            try:
                queued = submit()
            except Exception as error:
                answer.set_exception(error)
                return
            if not queued.done():
                delivery.queued()
            queued.add_done_callback(lambda done: _copy(done, answer))

        self._rollouts.submit(run)
        return answer

    # ------------------------------------------------------------------------ seats
    def _seat(self, front_end: int, stream: int, op: SeatOp, columns: int) -> None:
        key = (front_end, stream)
        with self._lock:
            if op is SeatOp.OPEN:
                if key in self._seats:
                    raise InvalidInput("handoff.stream", "a stream id not open", stream)
                self._seats[key] = _RemoteSeat(self.engine.open_seat(columns))
                return
            remote = self._seats.get(key) if op is not SeatOp.CLOSE else self._seats.pop(key, None)
        if remote is None:
            raise InvalidInput("handoff.stream", "a stream whose seat is open", stream)
        if op is SeatOp.WAIT:
            wait = remote.seat.waiting()
            wait.__enter__()
            remote.waits.append(wait)
        elif op is SeatOp.RESUME and remote.waits:
            remote.waits.pop().__exit__(None, None, None)
        elif op is SeatOp.CLOSE:
            self._close(remote)

    @staticmethod
    def _close(remote: _RemoteSeat) -> None:
        remote.closed = True
        while remote.waits:
            remote.waits.pop().__exit__(None, None, None)
        remote.seat.close()

    def _gone(self, front_end: int) -> None:
        self._on_gone(front_end)
        with self._lock:
            mine = [key for key in self._seats if key[0] == front_end]
            seats = [self._seats.pop(key) for key in mine]
        for remote in seats:
            self._close(remote)
        if seats:
            logs.event(logging.INFO, "handoff: a gone front end's streams closed",
                       front_end=front_end, streams=len(seats))  # fmt: skip

    # ------------------------------------------------------------------------ calls
    def _call(self, front_end: int, name: str, args: Any) -> Any:
        engine, args = self.engine, args or {}
        if name == calls.CONFIG:
            return {"config": engine.config.public_dict(),
                    "inference_only": engine.inference_only}  # fmt: skip
        if name == calls.CHECKPOINT:
            return calls.info_to_json(engine.checkpoint(args.get("name")))
        if name == calls.RESTORE:
            info, digest = engine.restore(args["name"])
            return {"checkpoint": calls.info_to_json(info), "digest": digest}
        if name == calls.LIST_CHECKPOINTS:
            return [calls.info_to_json(info) for info in engine.list_checkpoints()]
        if name == calls.UPDATE_HYPERPARAMS:
            return engine.update_hyperparams(args["values"])
        if name == calls.STATUS:
            return calls.status_to_json(engine.status())
        if name == calls.DRAIN:
            grace = args.get("grace_s")
            return calls.info_to_json(engine.drain(float("inf") if grace is None else grace))
        if self._on_call is not None:
            return self._on_call(front_end, name, args)
        raise InvalidInput("handoff.call", "a call the learner answers", repr(name))


def _copy(done: Future[StepResult], into: Future[StepResult]) -> None:
    error = done.exception()
    if error is not None:
        into.set_exception(error)
    else:
        into.set_result(done.result())
