"""Act: actions, log-probabilities and values from the online network, in every mode.

Each call draws fresh Philox counters (the `act_calls` counter's sequence) and runs as one
call of the executor per (rows, mode), so a capturing executor replays it. `Policy` reads the
live parameters; `PolicySnapshot` (snapshot.py) reads a published copy of them.
"""

from __future__ import annotations

import numpy as np

from service.backend.executor import Executor
from service.errors import InvalidInput
from service.trainer import model
from service.trainer.state import State
from service.types import ActMode, ActResult


class Policy:
    """Acts with the parameters of `state`: `params`, `value_norm` and the policy `version`
    are what Act reads, the device `sequence` the Philox sequence it is handed."""

    def __init__(self, state: State, executor: Executor) -> None:
        self.state, self.executor = state, executor
        self.params, self.value_norm = state.params, state.value_norm
        self.sequence = state.sequences["act_calls"]

    @property
    def version(self) -> int:
        """The policy version Act reports: the Steps applied to the parameters it reads."""
        return self.state.global_step

    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        """Actions for observations [N, D]; each call draws fresh Philox counters."""
        self.check_inputs(obs, mode, epsilon)
        state = self.state
        outputs = self._outputs(state.xp.asarray(obs, dtype=state.dtype), mode, epsilon)
        actions, log_probs, values = (state.backend.to_host(a) for a in outputs)
        return ActResult(
            actions=actions,
            log_probs=log_probs,
            values=values,
            policy_version=self.version,
        )

    def check_inputs(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> None:
        """InvalidInput naming the first of `act`'s arguments that is wrong."""
        D = self.state.config.model.obs_dim
        if not isinstance(obs, np.ndarray) or obs.ndim != 2 or obs.shape[1] != D:
            got = list(obs.shape) if isinstance(obs, np.ndarray) else type(obs).__name__
            raise InvalidInput("obs", f"an array of shape [N, {D}]", got)
        if obs.dtype.kind != "f" or not np.isfinite(obs).all():
            raise InvalidInput("obs", "finite floating-point values", f"dtype {obs.dtype}")
        if not isinstance(mode, ActMode):
            raise InvalidInput("mode", f"one of {[m.name for m in ActMode]}", mode)
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput("epsilon", "a probability in [0, 1]", epsilon)

    def act_on_device(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> tuple:
        """Act on observations already on the device [N, D], reading nothing back: the
        (actions int32, log π(a|s), V(s)) [N] device arrays, valid until the next Act of the
        same shape (a captured call's outputs). Only the shape and dtype are checked."""
        D, dtype = self.state.config.model.obs_dim, self.state.dtype
        if getattr(obs, "shape", None) is None or obs.ndim != 2 or obs.shape[1] != D:
            raise InvalidInput("obs", f"an array of shape [N, {D}]", getattr(obs, "shape", obs))
        if obs.dtype != dtype:
            raise InvalidInput("obs", f"dtype {dtype}", f"dtype {obs.dtype}")
        if not isinstance(mode, ActMode):
            raise InvalidInput("mode", f"one of {[m.name for m in ActMode]}", mode)
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput("epsilon", "a probability in [0, 1]", epsilon)
        return self._outputs(obs, mode, epsilon)

    def _outputs(self, x: np.ndarray, mode: ActMode, epsilon: float) -> tuple:
        """Act's device work on device observations; advances the act counter."""
        counters = self.state.counters
        self.sequence.fill(int(counters["act_calls"][0]))
        outputs = self.executor.run(
            ("act", x.shape[0], mode), lambda obs, eps: self._forward(obs, mode, eps), x, epsilon
        )
        counters["act_calls"] += 1
        return outputs

    def _forward(self, x: np.ndarray, mode: ActMode, epsilon) -> tuple:
        """Act's device work: forwards and the action choice (what a captured Act replays)."""
        state, ops, cfg = self.state, self.state.backend.ops, self.state.config
        params = self.params
        h = model.encoder_fwd(ops, params, x, cfg.model.depth)[-1]
        logits = model.head_fwd(ops, params, "pi", h)
        values = self.value_norm.denormalize(model.head_fwd(ops, params, "v", h)[:, 0])
        q_values = None
        if mode in (ActMode.GREEDY_Q, ActMode.EPSILON_GREEDY):
            A, Z = cfg.model.num_actions, cfg.c51.num_atoms
            probs = model.q_distribution(ops, params, h, A, Z)
            q_values = ops.c51_q_values(probs, state.support)
        actions, log_probs = ops.act_select(
            logits, q_values, mode, epsilon, state.key_on_device, self.sequence
        )
        return actions, log_probs, values
