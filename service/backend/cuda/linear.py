"""Linear layers on CuPy: cuBLAS SGEMM (`gemm`) and kernels/reduce_axis0.cu for the bias
gradient, which sums the batch in a fixed order."""

from __future__ import annotations

import cupy
import numpy as np

from service.backend.cuda.gemm import gemm
from service.backend.cuda.launch import BLOCK, Array, KernelOps, strided_blocks
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import int32 as _int32

__all__ = ["LinearOps"]

SINGLE_PASS_MAX_ROWS = 1024  # reduce_axis0: above this, fixed row chunks first
CHUNK_ROWS = 64  # reduce_axis0_partials: rows summed per partial
MAX_GRID_Y = 65535  # chunks a reduce_axis0_partials launch spans (the grid-stride covers more)


class LinearOps(KernelOps):
    """matmul, linear_fwd, linear_bwd_input, linear_bwd_params and reduce_axis0; the GEMMs at
    the ops' `precision` (gemm.py)."""

    def matmul(self, a: Array, b: Array) -> Array:
        """a @ b for a [M, K], b [K, N] (cuBLAS SGEMM, capturable: see gemm.py)."""
        a = _array("a", a, ndim=2)
        b = _array("b", b, ndim=2)
        if b.shape[0] != a.shape[1]:
            raise ValueError(f"b: expected shape [{a.shape[1]}, N], got {list(b.shape)}")
        return gemm(a, b, precision=self.precision)

    def linear_fwd(self, x: Array, W: Array, b: Array) -> Array:
        """y = x W + b for x [B, I], W [I, O], b [O] (cuBLAS SGEMM, then the bias add)."""
        x = _array("x", x, ndim=2)
        W = _array("W", W, ndim=2)
        if W.shape[0] != x.shape[1]:
            raise ValueError(f"W: expected shape [{x.shape[1]}, O], got {list(W.shape)}")
        b = _array("b", b, shape=(W.shape[1],))
        y = gemm(x, W, precision=self.precision)
        y += b
        return y

    def linear_bwd_input(self, W: Array, grad_y: Array) -> Array:
        """grad_x = g Wᵀ (cuBLAS SGEMM): the input half of y = x W + b's backward."""
        W = _array("W", W, ndim=2)
        grad_y = _array("grad_y", grad_y, ndim=2)
        if grad_y.shape[1] != W.shape[1]:
            raise ValueError(f"grad_y: expected shape [B, {W.shape[1]}], got {list(grad_y.shape)}")
        return gemm(grad_y, W, trans_b=True, precision=self.precision)

    def linear_bwd_params(self, x: Array, grad_y: Array) -> tuple[Array, Array]:
        """(grad_W = xᵀ g, grad_b = Σ_b g): the parameter half of y = x W + b's backward."""
        x = _array("x", x, ndim=2)
        grad_y = _array("grad_y", grad_y, ndim=2)
        if grad_y.shape[0] != x.shape[0]:
            raise ValueError(f"grad_y: expected {x.shape[0]} rows, got {list(grad_y.shape)}")
        grad_W = gemm(x, grad_y, trans_a=True, precision=self.precision)
        return grad_W, self.reduce_axis0(grad_y)

    def reduce_axis0(self, x: Array) -> Array:
        """Σ over the leading axis, deterministic (reduce_axis0.cu): x [rows, ...] -> [...].

        Up to SINGLE_PASS_MAX_ROWS rows, one thread per column adds the rows in order (NumPy's
        order). Beyond, fixed chunks of CHUNK_ROWS rows are summed in order first, then the
        chunks in order; the split depends on the shape alone.
        """
        x = _array("x", x)
        if x.ndim < 1:
            raise ValueError("x: expected at least 1 dimension, got a 0-d array")
        rows = x.shape[0]
        cols = int(np.prod(x.shape[1:], dtype=np.int64))
        _int32("x.shape[0]", rows)
        _int32("columns of x", cols)
        out = cupy.empty(x.shape[1:], dtype=cupy.float32)
        if cols == 0:
            return out
        current = x.reshape(rows, cols)
        while rows > SINGLE_PASS_MAX_ROWS:
            chunks = -(-rows // CHUNK_ROWS)
            partials = cupy.empty((chunks, cols), dtype=cupy.float32)
            grid = (strided_blocks(cols)[0], min(chunks, MAX_GRID_Y))
            self._kernel("reduce_axis0.cu", "reduce_axis0_partials")(
                grid,
                (BLOCK,),
                (current, partials, np.int32(rows), np.int32(cols), np.int32(CHUNK_ROWS)),
            )
            current, rows = partials, chunks
        self._kernel("reduce_axis0.cu", "reduce_axis0")(
            strided_blocks(cols), (BLOCK,), (current, out, np.int32(rows), np.int32(cols))
        )
        return out
