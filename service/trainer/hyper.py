"""The hyper-parameters the update reads, where its kernels read them.

On the NumPy backend a hyper-parameter is a Python float (NumPy's weak scalar: a float32
array times it stays float32). On a device backend every one lives in a single float64
device vector, and the update is handed one-element views of it: a captured CUDA graph bakes
in those addresses, so `refresh` (UpdateHyperparams) overwrites the vector in place and the
graph reads the new values on its next replay without being captured again.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from service.config import Config

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
KEYS = (*HOT_KEYS, *FIXED_KEYS, ZERO)


def setting(config: Config, key: str) -> float:
    """The value of `section.name` in `config` as a float (ZERO is 0.0)."""
    if key == ZERO:
        return 0.0
    section, name = key.split(".")
    return float(getattr(getattr(config, section), name))


class Hyperparams:
    """`hp[key]`: a Python float on NumPy, a float64 [1] view of the device vector elsewhere."""

    def __init__(self, config: Config, xp: ModuleType) -> None:
        self._on_host = xp is np
        self._values = np.array([setting(config, key) for key in KEYS], dtype=np.float64)
        self._index = {key: i for i, key in enumerate(KEYS)}
        self._device = None if self._on_host else xp.asarray(self._values)
        self._xp = xp
        self._gathers: dict[tuple[str, ...], object] = {}

    def __getitem__(self, key: str):
        i = self._index[key]
        if self._on_host:
            return float(self._values[i])
        return self._device[i : i + 1]

    def weights(self, keys: Sequence[str]):
        """Several settings as one vector: a list of floats on NumPy, else a float64 device
        array: a view of the vector where the keys are adjacent in KEYS (the head weights
        are), else gathered from it (a kernel, so it follows `refresh` inside a graph)."""
        if self._on_host:
            return [self[key] for key in keys]
        keys = tuple(keys)
        first = self._index[keys[0]]
        if [self._index[key] for key in keys] == list(range(first, first + len(keys))):
            return self._device[first : first + len(keys)]
        index = self._gathers.get(keys)
        if index is None:  # uploaded once, outside any capture
            index = self._gathers[keys] = self._xp.asarray([self._index[k] for k in keys])
        return self._device[index]

    def refresh(self, config: Config) -> None:
        """Take every value from `config`, in place."""
        self._values[:] = [setting(config, key) for key in KEYS]
        if self._device is not None:
            self._device[...] = self._xp.asarray(self._values)
