"""The encoder's element-wise kernels on CuPy: the bias + ReLU epilogue after each GEMM and its
gradient (kernels/encoder.cu), and the stacked rows' encoder gradient
(kernels/grad_h_accumulate.cu)."""

from __future__ import annotations

import cupy
import numpy as np

from service.backend.cuda.launch import BLOCK, Array, KernelOps, Scalar, strided_blocks
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import int32 as _int32
from service.backend.cuda.validate import same as _same
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["EncoderOps"]


def _vec(H: int) -> int:
    """Elements per thread step of encoder.cu (ENCODER_VEC) and grad_h_accumulate.cu
    (GRAD_H_VEC)."""
    return 4 if H % 4 == 0 else 1


def _aligned(H: int, **arrays: Array) -> None:
    """encoder.cu and grad_h_accumulate.cu read float4s when H % 4 == 0: each array must
    start on 16 bytes."""
    for name, a in arrays.items():
        if _vec(H) == 4 and a.data.ptr % 16:
            raise ValueError(f"{name}: expected an array starting on a 16-byte boundary")


class EncoderOps(KernelOps):
    """bias_relu_fwd, bias_relu_bwd and grad_h_stack."""

    def bias_relu_fwd(self, z: Array, b: Array) -> Array:
        """h = max(z + b, 0) for z [rows, H], b [H] (encoder.cu)."""
        H = self.dims.H
        z = _array("z", z, ndim=2)
        if z.shape[1] != H:
            raise ValueError(f"z: expected shape [rows, {H}], got {list(z.shape)}")
        b = _array("b", b, shape=(H,))
        h = cupy.empty_like(z)
        if z.size:
            kernel = self._kernel("encoder.cu", "bias_relu_fwd")
            _aligned(H, z=z, b=b)
            kernel(
                strided_blocks(z.size // _vec(H)), (BLOCK,), (z, b, h, _int32("rows", z.shape[0]))
            )
        return h

    def bias_relu_bwd(self, h: Array, grad_h: Array) -> Array:
        """grad_z = grad_h · 1[h > 0] for h, grad_h [rows, H] (encoder.cu)."""
        H = self.dims.H
        h = _array("h", h, ndim=2)
        if h.shape[1] != H:
            raise ValueError(f"h: expected shape [rows, {H}], got {list(h.shape)}")
        grad_h = _same("grad_h", grad_h, h)
        grad_z = cupy.empty_like(h)
        if h.size:
            kernel = self._kernel("encoder.cu", "bias_relu_bwd")
            _aligned(H, h=h, grad_h=grad_h)
            rows = _int32("rows", h.shape[0])
            kernel(strided_blocks(h.size // _vec(H)), (BLOCK,), (h, grad_h, grad_z, rows))
        return grad_z

    def grad_h_stack(self, top: Array, bottom: Array, weight: Scalar) -> Array:
        """[top; λ bottom] for top [n, H], bottom [m, H] (grad_h_accumulate.cu): the stacked
        rows' encoder gradient in one pass."""
        top = _array("top", top, ndim=2)
        if top.shape[1] != self.dims.H:
            raise ValueError(f"top: expected shape [rows, {self.dims.H}], got {list(top.shape)}")
        bottom = _array("bottom", bottom, ndim=2)
        if bottom.shape[1] != self.dims.H:
            got = list(bottom.shape)
            raise ValueError(f"bottom: expected shape [rows, {self.dims.H}], got {got}")
        w = _scalar("weight", weight)
        rows = top.shape[0] + bottom.shape[0]
        _int32("rows of top and bottom", rows)
        out = cupy.empty((rows, self.dims.H), dtype=cupy.float32)
        if out.size:
            _aligned(self.dims.H, top=top, bottom=bottom)
            self._kernel("grad_h_accumulate.cu", "grad_h_stack")(
                strided_blocks(out.size // _vec(self.dims.H)),
                (BLOCK,),
                (top, bottom, w, np.int32(top.shape[0]), np.int32(bottom.shape[0]), out),
            )
        return out
