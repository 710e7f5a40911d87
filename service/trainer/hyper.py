"""The hyper-parameters the update reads, where its kernels read them.

The values sit in one vector of the backend's `Scalars`: Python floats on NumPy (NumPy's weak
scalars: a float32 array times one stays float32), one float64 device vector on a device
backend, of which the update is handed one-element views. A captured call bakes in those
addresses, so `refresh` (UpdateHyperparams) overwrites the vector in place and the capture
reads the new values on its next replay without being captured again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from service.backend.executor import Scalars
from service.config import Config, kickstart_weight

# Settings UpdateHyperparams may change between Steps.
HOT_KEYS = (
    "optim.lr",
    "optim.weight_decay",
    "optim.max_grad_norm",
    "train.gamma",
    "train.lambda_q",
    "train.lambda_pi",
    "train.lambda_v",
    "train.lambda_bce",
    "train.lambda_aux",
    "ppo.gae_lambda",
    "ppo.clip_eps",
    "ppo.ent_coef",
    "ppo.value_clip_eps",
    "c51.target_tau",
)
# Fixed for a run, but read by the same kernels, so kept beside the hot ones.
FIXED_KEYS = ("optim.beta1", "optim.beta2", "optim.eps", "c51.v_min", "c51.v_max")
ZERO = "zero"  # the weight decay of biases
# Set by the Step from the config and the global step (`Hyperparams.at_step`), not by a key.
KICKSTART = "kickstart.weight"
KEYS = (*HOT_KEYS, *FIXED_KEYS, ZERO, KICKSTART)


def setting(config: Config, key: str, global_step: int = 0) -> float:
    """The value of `section.name` in `config` as a float (ZERO is 0.0; KICKSTART the
    kickstart loss's weight on the Step after `global_step`)."""
    if key == ZERO:
        return 0.0
    if key == KICKSTART:
        return kickstart_weight(config.kickstart, global_step)
    section, name = key.split(".")
    return float(getattr(getattr(config, section), name))


class Hyperparams:
    """`hp[key]`: one setting as the backend's ops take it (see `Scalars`)."""

    def __init__(self, config: Config, scalars: Callable[[np.ndarray], Scalars]) -> None:
        self._index = {key: i for i, key in enumerate(KEYS)}
        self._config, self._step = config, 0
        self._values = scalars(_settings(config, 0))

    def __getitem__(self, key: str) -> Any:
        return self._values.one(self._index[key])

    def weights(self, keys: Sequence[str]) -> Any:
        """Several settings as one argument: a span of the vector where the keys are adjacent
        in KEYS (the head weights are), else gathered from it."""
        index = tuple(self._index[key] for key in keys)
        if index == tuple(range(index[0], index[0] + len(index))):
            return self._values.span(index[0], index[0] + len(index))
        return self._values.gather(index)

    def refresh(self, config: Config) -> None:
        """Take every value from `config`, in place."""
        self._config = config
        self._values.write(_settings(config, self._step))

    def at_step(self, global_step: int) -> None:
        """Before a Step: the values that follow the global step (the kickstart weight) for
        the Step after `global_step` applied ones, written in place where they change; a
        function of the step alone, so a resumed run reads what an unbroken one does."""
        before = kickstart_weight(self._config.kickstart, self._step)
        self._step = global_step
        if kickstart_weight(self._config.kickstart, global_step) != before:
            self._values.write(_settings(self._config, global_step))


def _settings(config: Config, global_step: int) -> np.ndarray:
    return np.array([setting(config, key, global_step) for key in KEYS], dtype=np.float64)
