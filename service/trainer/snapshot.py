"""Acting that never waits for learning: Act reads a published copy of the policy.

A Step trains the live parameters; a `PolicySnapshot` holds its own copy of what Act reads (the
encoder and every head, and the value head's return statistics) with the policy version they
are, and runs Act on an executor of its own, so an Act forward runs beside a Step instead of
behind it. `publish` refreshes the copy in place (a captured Act keeps reading the same
buffers) with a device-to-device copy on the live lane, ordered after the Acts already queued
on the snapshot's lane (they read the old copy) and before those queued after it. The caller
serialises `publish` with `act` (the server's acting lock); neither waits for the device on
the host.

Act's Philox sequence is the trainer's own `act_calls` counter, so Acts on the snapshot draw
what Acts on the live trainer would: with one caller, acting after each Step's publish gives
the live trainer's bytes.
"""

from __future__ import annotations

import numpy as np

from service.backend.executor import Executor
from service.trainer.policy import Policy
from service.trainer.state import State
from service.trainer.value_norm import ValueNorm
from service.types import ActMode, ActResult


class PolicySnapshot(Policy):
    """A copy of the policy `state` trains, refreshed by `publish`; `executor` is its own,
    `live` the one the state's work runs on."""

    def __init__(self, state: State, executor: Executor, live: Executor) -> None:
        super().__init__(state, executor)
        self._live = live
        xp = state.xp
        live_norm = state.value_norm
        with executor.scope():
            executor.join(live.mark())  # the live arrays' writes so far come first
            self.params = {name: array.copy() for name, array in state.params.items()}
            self.value_norm = ValueNorm(xp, state.dtype, live_norm.decay, live_norm.enabled)
            self.value_norm.stats[...] = live_norm.stats
            self.sequence = xp.zeros(1, dtype=np.int64)
        self._version = state.global_step

    @property
    def version(self) -> int:
        """The policy version of the published copy."""
        return self._version

    def publish(self) -> None:
        """Copy the live parameters and return statistics into the snapshot, in place."""
        live, mine, state = self._live, self.executor, self.state
        with live.scope():
            live.join(mine.mark())  # Acts queued so far read the old copy before it changes
            for name, array in state.params.items():
                self.params[name][...] = array
            self.value_norm.stats[...] = state.value_norm.stats
            published = live.mark()
        with mine.scope():
            mine.join(published)
        self._version = state.global_step

    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        """`Policy.act` on the snapshot, padded to the executor's row sizes (padding rows are
        zeros, cut off again: every row's draws depend on its own index alone)."""
        rows = obs.shape[0] if isinstance(obs, np.ndarray) and obs.ndim == 2 else 0
        padded = self.executor.padded_rows(rows) if rows else rows
        with self.executor.scope():
            if padded == rows:
                return super().act(obs, mode, epsilon)
            full = np.zeros((padded, obs.shape[1]), dtype=obs.dtype)
            full[:rows] = obs
            result = super().act(full, mode, epsilon)
        return ActResult(
            actions=result.actions[:rows],
            log_probs=result.log_probs[:rows],
            values=result.values[:rows],
            policy_version=result.policy_version,
        )
