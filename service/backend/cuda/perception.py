"""The perception heads' losses on CuPy (kernels/perception_heads.cu): the BCE head (next mid
move up) and the auxiliary regression heads, means reduced in a fixed order by one block."""

from __future__ import annotations

import cupy
import numpy as np

from service.backend.cuda.launch import Array, KernelOps, scalar_out
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import batch as _batch

__all__ = ["PerceptionOps"]


class PerceptionOps(KernelOps):
    """bce_fwd_bwd and aux_mse_fwd_bwd."""

    def bce_fwd_bwd(self, u: Array, y: Array) -> tuple[Array, Array]:
        """(loss 0-d, grad_u [B]) of mean softplus(u) - y u for logits u, labels y [B] float32."""
        u, B = _batch("u", u, ())
        y = _array("y", y, shape=(B,))
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad = cupy.empty_like(u)
        loss = scalar_out()
        file = "perception_heads.cu"
        self._launch(file, "bce_fwd_bwd", B, (u, y, per_row, grad, np.int32(B)))
        self._reduce(file, "perception_loss_mean", (per_row, loss, np.int32(B), np.int64(B)))
        return loss, grad

    def aux_mse_fwd_bwd(self, pred: Array, target: Array) -> tuple[Array, Array]:
        """(loss 0-d, grad_pred [B, K]) of mean (p - t)² over all B·K entries."""
        K = self.dims.K
        if K < 1:
            raise ValueError("pred: the aux head does not exist (compiled with K = 0)")
        pred, B = _batch("pred", pred, (K,))
        target = _array("target", target, shape=(B, K))
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad = cupy.empty_like(pred)
        loss = scalar_out()
        file = "perception_heads.cu"
        self._launch(file, "aux_mse_fwd_bwd", B, (pred, target, per_row, grad, np.int32(B)))
        self._reduce(file, "perception_loss_mean", (per_row, loss, np.int32(B), np.int64(B * K)))
        return loss, grad
