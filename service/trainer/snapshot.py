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

from dataclasses import dataclass

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
        self._host: _HostRows | None = None

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
        """`Policy.act` on the snapshot: the inputs checked, then `act_rows`."""
        self.check_inputs(obs, mode, epsilon)
        return self.act_rows([obs], mode, epsilon)

    def act_rows(self, parts: list[np.ndarray], mode: ActMode, epsilon: float) -> ActResult:
        """Actions for the rows of `parts` stacked (float [n, D] arrays whose values the
        caller has checked: the server's request validation), as one forward padded to the
        executor's row sizes (padding rows are zeros, cut off again: every row's draws depend
        on its own index alone). The rows are written once, into host memory the device copies
        by DMA, uploaded in one copy, and the three outputs come back into the same kind of
        memory with one wait for the device."""
        rows = sum(part.shape[0] for part in parts)
        padded = self.executor.padded_rows(rows)
        host = self._host_rows(padded)
        start = 0
        for part in parts:
            host.obs[start : start + part.shape[0]] = part
            start += part.shape[0]
        host.obs[rows:padded] = 0
        backend = self.state.backend
        with self.executor.scope():
            outputs = self._outputs(backend.to_device(host.obs[:padded]), mode, epsilon)
            for output, out in zip(outputs, host.outputs(padded), strict=True):
                backend.copy_to_host(output, out)
            self.executor.synchronize()
        actions, log_probs, values = (out[:rows].copy() for out in host.outputs(padded))
        return ActResult(actions, log_probs, values, self.version)

    def warm_up(self, max_rows: int, mode: ActMode = ActMode.SAMPLE) -> None:
        """Act in `mode` once on every padded row count up to `max_rows` rows and once more
        (eager, then captured), so that no later Act of those sizes waits for a capture. The
        act counter is put back: later Acts draw what they would have drawn without this."""
        counter = self.state.counters["act_calls"]
        before = counter.copy()
        D = self.state.config.model.obs_dim
        for rows in self.executor.padded_sizes(max_rows):
            zeros = np.zeros((rows, D), self.state.dtype)
            for _ in range(2):
                self.act_rows([zeros], mode, 0.0)
        counter[...] = before

    def _host_rows(self, rows: int) -> _HostRows:
        """The staging buffers, grown to hold `rows` rows."""
        if self._host is None or self._host.capacity < rows:
            empty, D = self.state.backend.host_empty, self.state.config.model.obs_dim
            self._host = _HostRows(
                obs=empty((rows, D), self.state.dtype),
                actions=empty((rows,), np.int32),
                log_probs=empty((rows,), self.state.dtype),
                values=empty((rows,), self.state.dtype),
            )
        return self._host


@dataclass
class _HostRows:
    """A snapshot's host buffers for Act: the observations going in, the outputs coming back."""

    obs: np.ndarray
    actions: np.ndarray
    log_probs: np.ndarray
    values: np.ndarray

    @property
    def capacity(self) -> int:
        return self.obs.shape[0]

    def outputs(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.actions[:rows], self.log_probs[:rows], self.values[:rows]
