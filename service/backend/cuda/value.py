"""The value head's loss on CuPy (kernels/v_head_fwd_bwd.cu): mean 0.5 (v - R)², optionally
PPO-clipped, reduced in a fixed order by one block."""

from __future__ import annotations

import cupy
import numpy as np

from service.backend.cuda.launch import Array, KernelOps, Scalar, scalar_out
from service.backend.cuda.loader import CudaDims
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import batch as _batch
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["ValueOps"]


class ValueOps(KernelOps):
    """value_fwd_bwd."""

    def __init__(self, dims: CudaDims) -> None:
        super().__init__(dims)
        self._unused: Array | None = None

    def _unused_scalar(self) -> Array:
        """A float64 [1] device array for a scalar argument the kernel will not read."""
        if self._unused is None:
            self._unused = cupy.zeros(1, dtype=cupy.float64)
        return self._unused

    def value_fwd_bwd(
        self, values: Array, returns: Array, old_values: Array, clip_eps: Scalar | None
    ) -> tuple[Array, Array]:
        """(loss 0-d, grad_values [B]) of mean 0.5 (v - R)², PPO-clipped when clip_eps is
        not None (a number or a float64 device scalar)."""
        values, B = _batch("values", values, ())
        returns = _array("returns", returns, shape=(B,))
        old_values = _array("old_values", old_values, shape=(B,))
        use_clip = clip_eps is not None
        # Unclipped, the kernel never reads clip_eps; any valid float64 pointer will do (one
        # made once, so an unclipped call uploads nothing, as a captured graph requires).
        eps = _scalar("clip_eps", clip_eps) if use_clip else self._unused_scalar()
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad = cupy.empty_like(values)
        loss = scalar_out()
        file = "v_head_fwd_bwd.cu"
        self._launch(
            file,
            "value_fwd_bwd",
            B,
            (values, returns, old_values, eps, np.int32(use_clip), per_row, grad, np.int32(B)),
        )
        self._reduce(file, "value_loss_mean", (per_row, loss, np.int32(B)))
        return loss, grad
