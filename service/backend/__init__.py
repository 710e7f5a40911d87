"""Compute backends: one op set (see `numpy_ops`), one implementation per device kind.

`backend/` knows arrays and math, nothing of RL. The NumPy module is the reference: every
other backend provides the same op names with the same signatures.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType

from service.backend import numpy_ops
from service.backend.host_memory import retain_freed_memory
from service.errors import BackendUnavailable

OP_NAMES: tuple[str, ...] = (
    "linear_fwd",
    "linear_bwd",
    "linear_bwd_params",
    "bias_relu_fwd",
    "bias_relu_bwd",
    "reduce_axis0",
    "bce_fwd_bwd",
    "aux_mse_fwd_bwd",
    "c51_softmax",
    "c51_support",
    "c51_q_values",
    "categorical_projection",
    "c51_support_clip_ratio",
    "c51_cross_entropy_fwd_bwd",
    "c51_head_bwd",
    "log_softmax",
    "ppo_surrogate_fwd_bwd",
    "normalize_advantages",
    "value_fwd_bwd",
    "gae",
    "grad_h_accumulate",
    "all_finite",
    "global_norm",
    "clip_coefficient",
    "advance_counter",
    "adamw_step",
    "target_refresh",
    "sample_categorical",
)

BACKEND_CHOICES = ("auto", "numpy", "cuda")


@dataclass(frozen=True)
class Backend:
    """A named op-set implementation and the device it runs on."""

    name: str
    device: str
    ops: ModuleType


def check_op_set(module: ModuleType) -> None:
    """Fail unless `module` defines every op with the reference (NumPy) signature."""
    for name in OP_NAMES:
        op = getattr(module, name, None)
        if op is None:
            raise BackendUnavailable(f"{module.__name__} lacks op {name!r}")
        expected = inspect.signature(getattr(numpy_ops, name)).parameters.keys()
        got = inspect.signature(op).parameters.keys()
        if list(got) != list(expected):
            raise BackendUnavailable(
                f"{module.__name__}.{name}: expected parameters {list(expected)}, got {list(got)}"
            )


def select_backend(name: str) -> Backend:
    """The backend for `train.backend`: 'numpy', or 'auto' (NumPy until a GPU backend lands)."""
    if name in ("auto", "numpy"):
        retain_freed_memory()
        return Backend(name="numpy", device="cpu", ops=numpy_ops)
    if name == "cuda":
        raise BackendUnavailable(
            "train.backend: 'cuda' is not available in this build yet; use 'numpy' or 'auto'"
        )
    raise BackendUnavailable(f"train.backend: expected one of {BACKEND_CHOICES}, got {name!r}")
