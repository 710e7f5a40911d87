"""The integrated trainer: one object over three roles that share one parameter store.

`Trainer` is what the server, the jobs and the checkpoints use. It holds the `State`
(parameters, moments, target, replay, save/load, digest), the `Learner` (the Step pipeline)
and the `Policy` (Act), all over the same arrays, and the backend's executor that runs their
device work: every call below runs inside the executor's scope.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager

import numpy as np

from service.backend import Backend
from service.backend.comm import Communicator
from service.config import Config
from service.config_sizes import sized_for
from service.trainer.hyper import HOT_KEYS
from service.trainer.learner import Learner
from service.trainer.policy import Policy
from service.trainer.sharding import Sharding
from service.trainer.sizing import sized_backend
from service.trainer.snapshot import PolicySnapshot
from service.trainer.state import State
from service.types import ActMode, ActResult, DeviceRollout, Rollout, StepResult

__all__ = ["HOT_KEYS", "Trainer"]


class Trainer:
    """Encoder, C51 / policy / value / perception heads, target network, replay and optimizers.

    `xp` and `dtype` are the array module and dtype that `act_on_device` and `step_on_device`
    take; `state`, `learner`, `policy` and `executor` are the parts, for code that needs one.
    """

    def __init__(
        self, config: Config, backend: Backend | None = None, comm: Communicator | None = None
    ) -> None:
        """`comm`: this rank's communicator in a data-parallel world (default: alone), which
        decides which of the config's train.data_shards it holds."""
        if backend is None:
            config, backend = sized_backend(config)
        config = sized_for(config, backend.name)  # the settings left to the backend
        self.backend = backend
        self.xp, self.dtype = self.backend.xp, np.dtype(config.model.dtype)
        self.state = State(config, self.backend, Sharding.of(config.train.data_shards, comm))
        # Made after the state, so that its work follows the state's first writes.
        self.executor = self.backend.executor(config.train.cuda_graphs, False)
        self.learner = Learner(self.state, self.executor)
        self.policy = Policy(self.state, self.executor)
        self._snapshot: PolicySnapshot | None = None

    @property
    def config(self) -> Config:
        """The settings the trainer runs with (hot ones change by `update_hyperparams`)."""
        return self.state.config

    @config.setter
    def config(self, config: Config) -> None:
        self.state.config = config

    @property
    def global_step(self) -> int:
        """Applied Steps so far; also the policy version Act reports."""
        return self.state.global_step

    def on_device(self) -> AbstractContextManager[object]:
        """Queue the block's device work where the trainer's runs (nothing to do on NumPy)."""
        return self.executor.scope()

    def synchronize(self) -> None:
        """Wait for every queued device call (a no-op on NumPy)."""
        self.executor.synchronize()

    def step(self, rollout: Rollout, finite: bool = False) -> StepResult:
        """Apply one Step. Raises InvalidInput (changing nothing) on malformed input. `finite`:
        the caller has checked every float of the rollout (`Learner.step`)."""
        with self.on_device():
            return self.learner.step(rollout, finite)

    def step_on_device(
        self, rollout: DeviceRollout, report: np.ndarray | None = None
    ) -> tuple[StepResult, np.ndarray]:
        """`Learner.step_on_device`: a Step on device arrays with one read of the device."""
        with self.on_device():
            return self.learner.step_on_device(rollout, report)

    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        """Actions for observations [N, D]; each call draws fresh Philox counters."""
        with self.on_device():
            return self.policy.act(obs, mode, epsilon)

    def act_on_device(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> tuple:
        """`Policy.act_on_device`: device outputs, nothing read back. The caller queues its
        next work on them inside `on_device()`."""
        with self.on_device():
            return self.policy.act_on_device(obs, mode, epsilon)

    def snapshot(self) -> PolicySnapshot:
        """The published policy, for Acts that run beside Steps (server.acting): made on first
        use, on an executor of its own, from the parameters as they are then; `publish()`
        refreshes it."""
        if self._snapshot is None:
            executor = self.backend.executor(self.config.train.cuda_graphs, True)  # urgent
            self._snapshot = PolicySnapshot(self.state, executor, self.executor)
        return self._snapshot

    def update_hyperparams(self, updates: Mapping[str, float]) -> None:
        """Change hot settings (HOT_KEYS) between Steps; all or nothing."""
        with self.on_device():
            self.state.update_hyperparams(updates)
        self.synchronize()

    def state_dict(self) -> dict[str, np.ndarray]:
        """`State.state_dict`: every array that defines the trainer, as host arrays."""
        with self.on_device():
            return self.state.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace the trainer's state with `state`, checked whole before anything changes."""
        with self.on_device():
            self.state.load_state_dict(state)
        self.synchronize()

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replace what Act reads only (an inference-only server's restore)."""
        with self.on_device():
            self.state.load_params(params)
        self.synchronize()

    def param_digest(self) -> str:
        """`State.param_digest`: sha256 over every parameter, target and optimizer tensor."""
        with self.on_device():
            return self.state.param_digest()

    def memory_bytes(self) -> int:
        """Bytes the backend holds for this trainer: parameters, target, moments and replay."""
        return self.state.memory_bytes()
