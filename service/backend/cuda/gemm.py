"""Row-major float32 GEMM through cuBLAS, callable while a stream captures a CUDA graph.

CuPy refuses every cuBLAS call during stream capture (cupy_backends' `cublas.setStream`
raises NotImplementedError), although cuBLAS itself supports capture once the handle has a
user workspace: then it allocates nothing (cuBLAS docs, "CUDA Graphs Support"). So this
module calls the cuBLAS library CuPy already loaded through ctypes, with its own handle and
one fixed workspace per stream, re-attached after every `cublasSetStream` (which resets it).

The same handle, workspace size and call serve eager launches and captures, so cuBLAS picks
the same algorithm for both and a replayed graph gives the eager bytes. Pointer mode is host:
α = 1 and β = 0 are fixed at the call (and in a captured graph). Math mode stays the default:
IEEE fp32, no TF32.

`tensor_core_gemm` runs kernels/gemm_tf32x3.cu (3xTF32 on the tensor cores, near-float32
accuracy, the encoder's epilogues fused). The update does not use it yet: bench/gemm.py
measured it slower than cuBLAS at the update's K = 256 products (bench/README.md).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import cupy
import numpy as np

from service.backend.cuda.loader import load_kernel
from service.backend.cuda.validate import array

__all__ = ["gemm", "tensor_core_gemm"]

WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommendation for Hopper is 32 MiB
_OP_N, _OP_T = 0, 1
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
        self._handle = _Ptr()
        _check(lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._workspaces: dict[int, cupy.ndarray] = {}

    def sgemm(self, a: cupy.ndarray, b: cupy.ndarray, trans_a: bool, trans_b: bool):
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
        status = lib.cublasSgemm_v2(
            handle,
            _OP_T if trans_b else _OP_N,
            _OP_T if trans_a else _OP_N,
            N,
            M,
            K,
            ctypes.byref(self._one),
            b.data.ptr,
            b.shape[1],
            a.data.ptr,
            a.shape[1],
            ctypes.byref(self._zero),
            c.data.ptr,
            N,
        )
        _check(status, "cublasSgemm")
        return c


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with cuBLAS status {status}")


@functools.cache
def _cublas(device: int) -> _Cublas:
    return _Cublas()


def gemm(
    a: cupy.ndarray, b: cupy.ndarray, trans_a: bool = False, trans_b: bool = False
) -> cupy.ndarray:
    """op(a) @ op(b) for C-contiguous float32 matrices, op = transpose where asked."""
    return _cublas(cupy.cuda.Device().id).sgemm(a, b, trans_a, trans_b)


# kernels/gemm_tf32x3.cu's tile geometry.
TILE_N, TILE_K, STAGES = 128, 16, 3
K_ROW, N_ROW = TILE_K + 4, TILE_N + 8  # floats per padded shared-memory row
MAX_GRID_Y = 65535  # row tiles a launch may have
LAYOUT_EPILOGUES = {"nn": ("", "bias_relu"), "nt": ("", "relu_gate")}  # the kernel's entries


def shared_bytes(tile_m: int, b_transposed: bool) -> int:
    """Dynamic shared memory of one block: STAGES x (A tile + B tile), padded rows."""
    b_floats = TILE_N * K_ROW if b_transposed else TILE_K * N_ROW
    return STAGES * (tile_m * K_ROW + b_floats) * 4


@functools.cache
def _tile_kernel(device: int, name: str, tile_m: int, b_transposed: bool) -> cupy.RawKernel:
    kernel = load_kernel("gemm_tf32x3.cu", name)
    kernel.max_dynamic_shared_size_bytes = shared_bytes(tile_m, b_transposed)  # > 48 KB: opt in
    return kernel


@functools.cache
def _multiprocessors(device: int) -> int:
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


def tensor_core_gemm(
    a: cupy.ndarray,
    b: cupy.ndarray,
    b_transposed: bool,
    epilogue: str = "",
    side: cupy.ndarray | None = None,
    tile_m: int | None = None,
) -> cupy.ndarray:
    """a @ (bᵀ if b_transposed else b) for C-contiguous float32 a [M, K] and b ([N, K] or
    [K, N]) by kernels/gemm_tf32x3.cu, then its `epilogue` on `side`: "bias_relu" (nn only:
    max(· + side, 0), side [N]) or "relu_gate" (nt only: · 1[side > 0], side [M, N]).
    `tile_m` (64 or 128 rows a block) defaults to 128 where that gives every multiprocessor a
    block, else 64 (twice the blocks, two per multiprocessor)."""
    a = array("a", a, ndim=2)
    b = array("b", b, ndim=2)
    M, K = a.shape
    N = b.shape[0] if b_transposed else b.shape[1]
    if b.shape[1 if b_transposed else 0] != K:
        raise ValueError(f"b: expected {K} {'columns' if b_transposed else 'rows'}, got {b.shape}")
    layout = "nt" if b_transposed else "nn"
    if epilogue not in LAYOUT_EPILOGUES[layout]:
        allowed = sorted(LAYOUT_EPILOGUES[layout])
        raise ValueError(f"epilogue: expected one of {allowed} for {layout}, got {epilogue!r}")
    want = {"": None, "bias_relu": (N,), "relu_gate": (M, N)}[epilogue]
    if want is not None:
        if side is None:
            raise ValueError(f"side: expected an array of shape {list(want)} for {epilogue!r}")
        side = array("side", side, shape=want)
    if tile_m not in (None, 64, 128):
        raise ValueError(f"tile_m: expected 64 or 128, got {tile_m!r}")
    c = cupy.empty((M, N), dtype=cupy.float32)
    if c.size == 0:
        return c
    device = cupy.cuda.Device().id
    columns = -(-N // TILE_N)
    if tile_m is None:
        tile_m = 128 if -(-M // 128) * columns >= _multiprocessors(device) else 64
    if -(-M // tile_m) > MAX_GRID_Y:
        most = tile_m * MAX_GRID_Y
        raise ValueError(f"a: expected at most {most} rows in {tile_m}-row tiles, got {M}")
    name = "_".join(part for part in ("gemm_tf32x3", layout, epilogue, str(tile_m)) if part)
    kernel = _tile_kernel(device, name, tile_m, b_transposed)
    args = (a, b, a if side is None else side, c, np.int32(M), np.int32(N), np.int32(K))
    grid = (columns, -(-M // tile_m))
    kernel(grid, (256,), args, shared_mem=shared_bytes(tile_m, b_transposed))
    return c
