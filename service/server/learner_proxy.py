"""The learner as a front-end process sees it: `LearnerProxy` answers `learner_api.LearnerApi`
over the handoff (service/handoff), so the servicer runs unchanged in a process of its own.

Rollouts and Acts cross in the handoff's shared-memory slots: a request's Step with its key,
actor and client (the learner's ledger, replays and turns work as in one process), an Interact
stream's rollouts under its stream id, whose seat (`SeatProxy`) opens, waits and closes at the
learner by SEAT messages. The control calls travel as JSON (`learner_calls`). What the learner
refuses comes back as the same `service.errors` class with its message, so the servicer
answers the same status code as in one process.

Callers that leave: a request whose caller left before its Step (`caller_waiting()` turns
false) is abandoned at the learner (ABANDON), found by one watcher thread every
`WATCH_PERIOD_S`; a stream's rollouts are abandoned when its seat closes.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import numpy as np

from service.api.trident.v1 import trainer_pb2 as pb
from service.config import Config
from service.errors import Abandoned, InferenceOnly, QueueFull
from service.handoff import Handoff, RolloutFuture
from service.handoff.channel import SeatOp
from service.server import learner_calls as calls
from service.step_ledger import StepKey
from service.types import ActMode, ActResult, CheckpointInfo, Rollout, StepResult

WATCH_PERIOD_S = 0.05  # how often callers of queued requests are looked at (the Step queue's)
SLOT_POLL_S = 0.1  # a rollout waiting for a free slot looks at its caller this often


class SeatProxy:
    """An Interact stream's seat at the learner (`learner_api.StreamSeat`), by its stream id."""

    def __init__(self, proxy: LearnerProxy, stream: int, columns: int) -> None:
        self.proxy, self.stream = proxy, stream
        proxy.handoff.seat(stream, SeatOp.OPEN, columns)

    def submit(
        self, rollout: Rollout, caller_waiting: Callable[[], bool], key: StepKey
    ) -> Future[StepResult]:
        """Hand the rollout to the learner under the stream's seat once a rollout slot is free,
        and return once the learner has queued it (or answered it): the stream waits for room
        in the Step queue, as in one process. Abandoned when the caller leaves while it waits
        for a slot; one that leaves while the learner waits for room is abandoned there, when
        the stream's seat closes."""
        future = self.proxy.submit_rollout(rollout, caller_waiting, key, self.stream)
        while not (future.queued.wait(SLOT_POLL_S) or future.done()) and caller_waiting():
            pass
        return future

    @contextmanager
    def waiting(self) -> Iterator[None]:
        self.proxy.handoff.seat(self.stream, SeatOp.WAIT)
        try:
            yield
        finally:
            self.proxy.handoff.seat(self.stream, SeatOp.RESUME)

    def close(self) -> None:
        if self.proxy.handoff.up:
            self.proxy.handoff.seat(self.stream, SeatOp.CLOSE)


class LearnerProxy:
    """`LearnerApi` over a connected `Handoff`. `server` is this process's own server section
    (the learner's replies leave its secrets out)."""

    def __init__(self, handoff: Handoff, server: Mapping[str, Any]) -> None:
        self.handoff, self._server = handoff, dict(server)
        answer = handoff.call(calls.CONFIG)
        self._inference_only = bool(answer["inference_only"])
        self._config = self._with_server(answer["config"])
        self._streams = itertools.count(1)
        self._watched: dict[int, tuple[Future[StepResult], Callable[[], bool]]] = {}
        self._lock = threading.Lock()
        self._watcher = threading.Thread(target=self._watch, name="trident-callers", daemon=True)
        self._watcher.start()

    def _with_server(self, sections: Mapping[str, Any]) -> Config:
        return Config.from_dict({**sections, "server": self._server})

    # ------------------------------------------------------------------------ the seam
    @property
    def config(self) -> Config:
        return self._config

    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    def require_training(self, what: str) -> None:
        if self._inference_only:
            raise InferenceOnly.refusing(what)

    def submit_step(
        self,
        rollout: Rollout,
        caller_waiting: Callable[[], bool],
        key: StepKey | None = None,
        client: Hashable = None,
    ) -> Future[StepResult]:
        """The rollout handed to the learner (`submit_rollout`), whose queue answers as in one
        process; its caller leaving later abandons it there (the watcher)."""
        self.require_training("Step")
        future = self.submit_rollout(rollout, caller_waiting, key, 0,
                                     "" if client is None else str(client))  # fmt: skip
        request = future.request
        with self._lock:
            self._watched[request] = (future, caller_waiting)
        future.add_done_callback(lambda _: self._unwatch(request))
        return future

    def open_seat(self, columns: int) -> SeatProxy:
        return SeatProxy(self, next(self._streams), columns)

    def submit_act(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        return self.handoff.submit_act(obs, mode, epsilon)  # copied once, into an Act slot

    def checkpoint(self, name: str | None) -> CheckpointInfo:
        self.require_training("Checkpoint")
        info = calls.info_from_json(self.handoff.call(calls.CHECKPOINT, {"name": name}))
        assert info is not None
        return info

    def restore(self, name: str) -> tuple[CheckpointInfo, str]:
        self.require_training("Restore")
        answer = self.handoff.call(calls.RESTORE, {"name": name})
        self._refresh()
        info = calls.info_from_json(answer["checkpoint"])
        assert info is not None
        return info, answer["digest"]

    def list_checkpoints(self) -> list[CheckpointInfo]:
        infos = [calls.info_from_json(i) for i in self.handoff.call(calls.LIST_CHECKPOINTS)]
        return [info for info in infos if info is not None]

    def update_hyperparams(self, values: Mapping[str, float]) -> str:
        self.require_training("UpdateHyperparams")
        answer: str = self.handoff.call(calls.UPDATE_HYPERPARAMS, {"values": dict(values)})
        self._refresh()
        return answer

    def status(self) -> pb.GetStatusResponse:
        return calls.status_from_json(self.handoff.call(calls.STATUS))

    def drain(self, grace_s: float = float("inf")) -> CheckpointInfo | None:
        grace = None if grace_s == float("inf") else grace_s  # JSON has no infinity
        return calls.info_from_json(self.handoff.call(calls.DRAIN, {"grace_s": grace}))

    # ------------------------------------------------------------------------ internals
    def submit_rollout(
        self,
        rollout: Rollout,
        caller_waiting: Callable[[], bool],
        key: StepKey | None,
        stream: int,
        client: str = "",
    ) -> RolloutFuture:
        """The rollout into a free rollout slot and on to the learner, waiting for a slot
        while every one is in the learner's hands (they come free as Steps answer); Abandoned
        where the caller leaves first."""
        while True:
            try:
                return self.handoff.submit_rollout(
                    rollout, None if key is None else (key.actor, key.sequence), stream,
                    SLOT_POLL_S, client,
                )  # fmt: skip
            except QueueFull:
                if not caller_waiting():
                    raise Abandoned("caller left while its rollout waited for a slot") from None

    def _refresh(self) -> None:
        """The learner's settings again: a Restore or an update may have changed them."""
        self._config = self._with_server(self.handoff.call(calls.CONFIG)["config"])

    def _unwatch(self, request: int) -> None:
        with self._lock:
            self._watched.pop(request, None)

    def _watch(self) -> None:
        """Abandon at the learner the requests whose callers left (once each)."""
        while self.handoff.up:
            time.sleep(WATCH_PERIOD_S)
            with self._lock:
                left = [request for request, (future, waiting) in self._watched.items()
                        if not future.done() and not waiting()]  # fmt: skip
                for request in left:
                    del self._watched[request]
            for request in left:
                self.handoff.abandon(request)
