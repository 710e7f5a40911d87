"""The seam between a gRPC front end and the learner process: all that the servicer asks of the
learner, stated once.

A front end terminates gRPC, authenticates, validates and decodes, and holds its streams'
rollout assembly; through this seam it hands the learner whole rollouts (a request's Step, or
an Interact stream's through its `StreamSeat`) and gets each one's StepResult as a future, asks
for actions on validated observations, and passes on the control calls. The servicer knows the
learner by this Protocol alone: `server.engine.Engine` answers it in the learner's own
process, and a proxy for another process can answer it the same way.

The errors are the domain's (`service.errors`), mapped to status codes by the servicer
(server.status): what the learner refuses travels as the exception, in the future for what it
refuses once a rollout is queued.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from service.api.trident.v1 import trainer_pb2 as pb
from service.config import Config
from service.step_ledger import StepKey
from service.types import ActMode, ActResult, CheckpointInfo, Rollout, StepResult


class StreamSeat(Protocol):
    """An Interact stream's place at the learner, from the stream's first request to its end:
    its rollouts are keyed Steps, trained side by side with other streams' in the learner's
    Step, and its columns size that Step while it produces."""

    def submit(
        self, rollout: Rollout, caller_waiting: Callable[[], bool], key: StepKey
    ) -> Future[StepResult]:
        """Queue rollout `key` once the queue has room (waited for: backpressure); refusals
        as `LearnerApi.submit_step`'s. Abandoned where `caller_waiting()` turns false first."""
        ...

    def waiting(self) -> AbstractContextManager[None]:
        """The stream sends nothing until the block ends, so no Step waits for it."""
        ...

    def close(self) -> None:
        """The stream has ended: its columns size no more Steps."""
        ...


class LearnerApi(Protocol):
    """What a front end needs from the learner process."""

    @property
    def config(self) -> Config:
        """The learner's settings as they are now: the model's shapes and the limits that
        request validation reads."""
        ...

    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array for a stream's rollout, in the memory the learner reads it from fastest."""
        ...

    def require_training(self, what: str) -> None:
        """InferenceOnly naming `what` where the learner answers Act alone."""
        ...

    def submit_step(self, rollout: Rollout, caller_waiting: Callable[[], bool],
                    key: StepKey | None = None, client: Hashable = None) -> Future[StepResult]:
        """Queue a request's validated rollout (`client`: whose, for the queue's turns;
        `key`: its idempotency key). QueueFull at once where the queue has no room for it;
        a key applied before is answered (`replayed`), one still queued is joined;
        ForgottenStepKey, KeyReused and StalePolicy are raised before it queues, and
        whatever refuses it later (Abandoned where `caller_waiting()` turns false before its
        Step, StalePolicy, Unavailable on a drain) is the future's exception."""
        ...

    def open_seat(self, columns: int) -> StreamSeat:
        """A place for an Interact stream of `columns` environments."""
        ...

    def submit_act(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        """Actions for validated observations `obs` [n, obs_dim], from the published policy,
        in a future returned once the request is queued (the caller can do other work
        meanwhile; `obs` is read until it is done); Unavailable once draining."""
        ...

    def checkpoint(self, name: str | None) -> CheckpointInfo:
        """Commit a checkpoint of the state as it is (None: named by its global step)."""
        ...

    def restore(self, name: str) -> tuple[CheckpointInfo, str]:
        """Replace the state with checkpoint `name`'s; it and the restored parameters' digest."""
        ...

    def list_checkpoints(self) -> list[CheckpointInfo]:
        """The committed checkpoints, the one committed last first."""
        ...

    def update_hyperparams(self, values: Mapping[str, float]) -> str:
        """Set hot settings by their dotted names; the settings as they are now, as JSON."""
        ...

    def status(self) -> pb.GetStatusResponse:
        """GetStatus's answer."""
        ...

    def drain(self, grace_s: float = float("inf")) -> CheckpointInfo | None:
        """Apply the queued Steps that start within `grace_s`, answer the Acts pending, take no
        more, and commit a final checkpoint of what is new (None where nothing is)."""
        ...
