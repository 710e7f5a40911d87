"""The learner process's side of the seam (`learner_api.LearnerApi`): the rooms wired together,
each with one concern, and their start and drain in order.

- `Acting` (server.acting): Act, one batched forward on the published policy snapshot, never
  waiting for learning;
- `Learner` (server.learner): the trainer, the Step queue it consumes, the ledger of applied
  Steps' keys; it applies Steps and publishes each to the snapshot;
- `Checkpointer` (server.checkpointer): the checkpoint clock, called by the Learner after each
  Step, Checkpoint / Restore / ListCheckpoints, the start's restore and the drain's final
  checkpoint;
- GetStatus's answer (server.get_status), read from the Learner and the Checkpointer.

An inference-only engine answers Act, GetStatus and ListCheckpoints, and refuses the rest.
Nothing here knows gRPC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from service import logs
from service.api.trident.v1 import trainer_pb2 as pb
from service.checkpoint import load_policy
from service.config import Config
from service.errors import InferenceOnly
from service.server.acting import Acting
from service.server.checkpointer import Checkpointer
from service.server.get_status import status_response
from service.server.learner import Learner, StreamSeat
from service.server.metrics import Metrics
from service.step_ledger import StepKey
from service.trainer.trainer import Trainer
from service.types import ActMode, ActResult, CheckpointInfo, Rollout, StepResult


class Engine:
    """Owns the trainer for the server's lifetime, through the rooms it wires.

    `clock` is the monotonic clock (seconds) behind the Step and Act duration metrics and the
    Step queue's waits; a simulation or a test can pass its own.
    """

    def __init__(
        self,
        trainer: Trainer,
        metrics: Metrics,
        inference_only: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.trainer, self.metrics, self.clock = trainer, metrics, clock
        self.inference_only = inference_only
        self.acting = Acting(trainer, metrics, clock)
        self.learner = Learner(trainer, metrics, self.acting, clock)
        self.checkpointer = Checkpointer(self.learner, metrics, clock)
        self.learner.after_step = self.checkpointer.after_step  # the clock in the Step's loop
        self.root = self.checkpointer.root  # checkpoint.dir
        self.metrics.device_memory.set(trainer.memory_bytes())

    @classmethod
    def for_inference(cls, config: Config, name: str, metrics: Metrics) -> Engine:
        """An Act-only engine from checkpoint `name`: the checkpoint's model and parameters, this
        server's own server, checkpoint and backend settings, and no replay to speak of."""
        saved, params = load_policy(config.checkpoint.dir, name)
        mine = config.to_dict()
        sections = {**saved.to_dict(), "server": mine["server"], "checkpoint": mine["checkpoint"]}
        sections["train"] = {**sections["train"], "backend": config.train.backend}
        sections["replay"] = {"capacity": 1, "batch_size": 1, "min_size": 1}
        trainer = Trainer(Config.from_dict(sections))
        trainer.load_params(params)
        logs.event(logging.INFO, "inference-only", checkpoint=name)
        return cls(trainer, metrics, inference_only=True)

    # ------------------------------------------------------------------------ the seam
    @property
    def config(self) -> Config:
        return self.trainer.config

    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return self.trainer.backend.host_empty(shape, dtype)

    def require_training(self, what: str) -> None:
        """InferenceOnly naming `what` on an Act-only server."""
        if self.inference_only:
            raise InferenceOnly.refusing(what)

    def submit_step(
        self,
        rollout: Rollout,
        caller_waiting: Callable[[], bool],
        key: StepKey | None = None,
        client: Hashable = None,
    ) -> Future[StepResult]:
        """`Learner.submit_step` for a request's rollout."""
        self.require_training("Step")
        return self.learner.submit_step(rollout, caller_waiting, key, client=client)

    def open_seat(self, columns: int) -> StreamSeat:
        return self.learner.open_seat(columns)

    def submit_act(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        return self.acting.submit(obs, mode, epsilon)

    @property
    def act_queue_depth(self) -> int:
        """Act requests waiting to join a batch: a load signal beside the Step queue's depth."""
        return self.acting.queue_depth

    def checkpoint(self, name: str | None) -> CheckpointInfo:
        self.require_training("Checkpoint")
        return self.checkpointer.checkpoint(name)

    def restore(self, name: str) -> tuple[CheckpointInfo, str]:
        self.require_training("Restore")
        return self.checkpointer.restore(name)

    def list_checkpoints(self) -> list[CheckpointInfo]:
        return self.checkpointer.list_checkpoints()

    def update_hyperparams(self, values: Mapping[str, float]) -> str:
        self.require_training("UpdateHyperparams")
        return self.learner.update_hyperparams(values)

    def status(self) -> pb.GetStatusResponse:
        return status_response(self.learner, self.checkpointer, self.inference_only)

    # ------------------------------------------------------------------------ lifecycle
    def start(self, restore: str | None, resume: bool = False) -> None:
        """A training server's start: `Checkpointer.start` (restore `restore`, or with `resume`
        the newest valid checkpoint), then the schedule's metrics of the state it starts from."""
        if self.inference_only:
            return
        self.checkpointer.start(restore, resume)
        with self.learner.lock:
            self.learner.observe_rate()

    def drain(self, grace_s: float = float("inf")) -> CheckpointInfo | None:
        """Finish queued Steps (those that start within `grace_s`) and Acts, then commit a
        final checkpoint (training servers) of what is new since the newest checkpoint saved
        or restored (`Checkpointer.final`)."""
        self.learner.close(grace_s)
        self.acting.close()
        if self.inference_only:
            return None
        return self.checkpointer.final()
