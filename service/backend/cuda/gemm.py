"""Row-major float32 GEMM through cuBLAS, callable while a stream captures a CUDA graph.

CuPy refuses every cuBLAS call during stream capture (cupy_backends' `cublas.setStream`
raises NotImplementedError), although cuBLAS itself supports capture once the handle has a
user workspace: then it allocates nothing (cuBLAS docs, "CUDA Graphs Support"). So this
module calls the cuBLAS library CuPy already loaded through ctypes, with its own handle and
one fixed workspace per stream, re-attached after every `cublasSetStream` (which resets it).

The same handle, workspace size and call serve eager launches and captures, so cuBLAS picks
the same algorithm for both and a replayed graph gives the eager bytes. Pointer mode is host:
α = 1 and β = 0 are fixed at the call (and in a captured graph).

Precision (`train.precision`): "fp32" is cublasSgemm, IEEE fp32 (no TF32), what the NumPy twins
match. "tf32" is cublasGemmEx on the fp32 matrices with compute type
CUBLAS_COMPUTE_32F_FAST_TF32: cuBLAS rounds the inputs to TF32 on the tensor cores. "bf16"
rounds both operands to bfloat16 first (kernels/bf16.cu) and calls cublasGemmEx on bf16 operands
with CUBLAS_COMPUTE_32F; cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands gives the TF32
bytes (cuBLAS runs TF32 kernels for it), so it would not be bf16. Both accumulate in fp32;
parameters, gradients and outputs stay fp32. cuBLAS's atomics mode is off by default, so every
precision gives the same bytes run to run.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import cupy
import numpy as np

from service.backend.cuda.launch import BLOCK, strided_blocks
from service.backend.cuda.loader import load_kernel

__all__ = ["gemm", "round_to_bf16"]

WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommendation for Hopper is 32 MiB
_OP_N, _OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_16BF, _GEMM_DEFAULT = 0, 14, -1
# train.precision -> (operand type, cublasComputeType_t); fp32 is cublasSgemm
COMPUTE = {
    "fp32": None,
    "tf32": (_CUDA_R_32F, 77),  # CUBLAS_COMPUTE_32F_FAST_TF32
    "bf16": (_CUDA_R_16BF, 68),  # CUBLAS_COMPUTE_32F on operands rounded to bf16
}
_Ptr, _Int = ctypes.c_void_p, ctypes.c_int


def _loaded_cublas() -> ctypes.CDLL:
    """The libcublas CuPy loaded (found in this process's memory map)."""
    cupy.cuda.device.get_cublas_handle()  # makes CuPy load cuBLAS
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if Path(path).name.startswith("libcublas.so"):
            return ctypes.CDLL(path)
    return ctypes.CDLL("libcublas.so.13")


class _Cublas:
    """One cuBLAS handle of the current device, with one workspace per stream."""

    def __init__(self) -> None:
        lib = self._lib = _loaded_cublas()
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(_Ptr)]
        lib.cublasSetStream_v2.argtypes = [_Ptr, _Ptr]
        lib.cublasSetWorkspace_v2.argtypes = [_Ptr, _Ptr, ctypes.c_size_t]
        lib.cublasSgemm_v2.argtypes = [_Ptr, _Int, _Int, _Int, _Int, _Int, _Ptr, _Ptr, _Int,
                                       _Ptr, _Int, _Ptr, _Ptr, _Int]  # fmt: skip
        lib.cublasGemmEx.argtypes = [
            _Ptr, _Int, _Int, _Int, _Int, _Int, _Ptr, _Ptr, _Int, _Int, _Ptr, _Int, _Int, _Ptr,
            _Ptr, _Int, _Int, _Int, _Int,
        ]  # fmt: skip
        self._handle = _Ptr()
        _check(lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._workspaces: dict[int, cupy.ndarray] = {}

    def sgemm(
        self,
        a: cupy.ndarray,
        b: cupy.ndarray,
        trans_a: bool,
        trans_b: bool,
        compute: tuple[int, int] | None,
    ):
        M = a.shape[1] if trans_a else a.shape[0]
        K = a.shape[0] if trans_a else a.shape[1]
        N = b.shape[0] if trans_b else b.shape[1]
        c = cupy.empty((M, N), dtype=cupy.float32)
        if c.size == 0:
            return c
        if K == 0:
            c.fill(0)
            return c
        stream = cupy.cuda.get_current_stream().ptr
        workspace = self._workspaces.get(stream)
        if workspace is None:
            workspace = self._workspaces[stream] = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
        lib, handle = self._lib, self._handle
        _check(lib.cublasSetStream_v2(handle, stream), "cublasSetStream")
        _check(lib.cublasSetWorkspace_v2(handle, workspace.data.ptr, WORKSPACE_BYTES), "workspace")
        # Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands.
        ops = (_OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, N, M, K)
        one, zero = ctypes.byref(self._one), ctypes.byref(self._zero)
        if compute is None:
            status = lib.cublasSgemm_v2(handle, *ops, one, b.data.ptr, b.shape[1], a.data.ptr,
                                        a.shape[1], zero, c.data.ptr, N)  # fmt: skip
            _check(status, "cublasSgemm")
            return c
        operand, compute_type = compute
        if operand == _CUDA_R_16BF:
            a, b = round_to_bf16(a), round_to_bf16(b)
        status = lib.cublasGemmEx(
            handle, *ops, one, b.data.ptr, operand, b.shape[1], a.data.ptr, operand,
            a.shape[1], zero, c.data.ptr, _CUDA_R_32F, N, compute_type, _GEMM_DEFAULT,
        )  # fmt: skip
        _check(status, "cublasGemmEx")
        return c


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with cuBLAS status {status}")


_THREAD = threading.local()  # per thread: its handle of each device


def _cublas(device: int) -> _Cublas:
    """This thread's handle of `device`: a handle is not thread-safe (cublasSetStream, then the
    call), and the server's Act runs beside its Step, each on a thread of its own."""
    handles: dict[int, _Cublas] = _THREAD.__dict__.setdefault("handles", {})
    handle = handles.get(device)
    if handle is None:
        handle = handles[device] = _Cublas()
    return handle


def gemm(
    a: cupy.ndarray,
    b: cupy.ndarray,
    trans_a: bool = False,
    trans_b: bool = False,
    precision: str = "fp32",
) -> cupy.ndarray:
    """op(a) @ op(b) for C-contiguous float32 matrices, op = transpose where asked, at
    `precision` (COMPUTE's keys)."""
    if precision not in COMPUTE:
        raise ValueError(f"precision: expected one of {list(COMPUTE)}, got {precision!r}")
    return _cublas(cupy.cuda.Device().id).sgemm(a, b, trans_a, trans_b, COMPUTE[precision])


def round_to_bf16(x: cupy.ndarray) -> cupy.ndarray:
    """The bfloat16 bits (uint16, same shape) of float32 `x`, rounded to nearest even."""
    out = cupy.empty(x.shape, dtype=cupy.uint16)
    if x.size:
        kernel = load_kernel("bf16.cu", "round_to_bf16")
        kernel(strided_blocks(x.size), (BLOCK,), (x, np.int64(x.size), out))
    return out
