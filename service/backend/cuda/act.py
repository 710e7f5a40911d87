"""Act's action choice on CuPy (kernels/act.cu): sampling from π, greedy π or Q, ε-greedy,
with Philox draws keyed by the trainer's seed and its Act-call counter."""

from __future__ import annotations

import numbers

import cupy
import numpy as np

from service.backend.cuda.launch import Array, KernelOps, Scalar
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import batch as _batch
from service.backend.cuda.validate import key as _key
from service.backend.cuda.validate import scalar as _scalar
from service.backend.cuda.validate import sequence as _sequence

__all__ = ["ACT_MODES", "ActOps"]

# act.cu's ACT_MODE_*; keys are Trainer's ActMode values (an ActMode itself is accepted too).
ACT_MODES = {"sample": 0, "greedy_pi": 1, "greedy_q": 2, "epsilon_greedy": 3}


class ActOps(KernelOps):
    """sample_categorical and act_select."""

    def sample_categorical(self, logits: Array, uniforms: Array) -> Array:
        """Inverse-CDF sample per row of logits [N, A] with uniforms [N] in [0, 1) -> int32 [N]."""
        logits, N = _batch("logits", logits, (self.dims.A,))
        uniforms = _array("uniforms", uniforms, shape=(N,))
        actions = cupy.empty(N, dtype=cupy.int32)
        self._launch("act.cu", "sample_categorical", N, (logits, uniforms, actions, np.int32(N)))
        return actions

    def act_select(
        self,
        logits: Array,
        q_values: Array | None,
        mode: object,
        epsilon: Scalar,
        key: object,
        sequence: object,
    ) -> tuple[Array, Array]:
        """Trainer.act's action choice on the device: (actions int32 [N], log_probs [N]).

        logits [N, A] (policy head); q_values [N, A] (E[Z(s, a)]; needed by the Q modes, else
        may be None); mode: an ActMode or its value ('sample', 'greedy_pi', 'greedy_q',
        'epsilon_greedy'); epsilon: ε for 'epsilon_greedy' (number or float64 device scalar);
        key: the Philox key, (low, high) words or uint32 [2]; sequence: this call's act_calls
        counter value, an int or int64 [1] (the caller advances the counter). log_probs is
        log π(a|s) of the returned action, as ActResult.log_probs.
        """
        A = self.dims.A
        name = getattr(mode, "value", mode)
        if not isinstance(name, str) or name not in ACT_MODES:
            raise ValueError(f"mode: expected one of {sorted(ACT_MODES)}, got {mode!r}")
        logits, N = _batch("logits", logits, (A,))
        if q_values is None:
            if name in ("greedy_q", "epsilon_greedy"):
                raise ValueError(f"q_values: required by mode {name!r}, got None")
            q_values = logits  # never read by the policy modes; any valid pointer will do
        q_values = _array("q_values", q_values, shape=(N, A))
        if isinstance(epsilon, numbers.Real) and not 0.0 <= float(epsilon) <= 1.0:
            raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon!r}")
        args = (
            logits,
            q_values,
            np.int32(ACT_MODES[name]),
            _scalar("epsilon", epsilon),
            _key("key", key),
            _sequence("sequence", sequence),
        )
        actions = cupy.empty(N, dtype=cupy.int32)
        log_probs = cupy.empty(N, dtype=cupy.float32)
        self._launch("act.cu", "act_select", N, (*args, actions, log_probs, np.int32(N)))
        return actions, log_probs
