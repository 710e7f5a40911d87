"""bench/kernels/gemm_tf32x3.cu: row-major float32 GEMMs on the tensor cores at float32
accuracy (3xTF32), the encoder's epilogues fused, for bench/gemm.py.

The product does not use it: bench/gemm.py measured it slower than cuBLAS SGEMM at the
update's K = 256 products, and the update on it slower than on cuBLAS (docs/benchmarks/gemm.md). It
compiles with the product's NVRTC options (`loader.COMPILE_OPTIONS`: IEEE arithmetic, no
contraction) and the product's kernel directory on the include path (`common.cuh`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy
import numpy as np

from service.backend.cuda.loader import COMPILE_OPTIONS, kernel_dir
from service.backend.cuda.validate import array

__all__ = ["KERNEL", "tensor_core_gemm"]

KERNEL = Path(__file__).resolve().parent / "kernels" / "gemm_tf32x3.cu"

# The kernel's tile geometry.
TILE_N, TILE_K, STAGES = 128, 16, 3
K_ROW, N_ROW = TILE_K + 4, TILE_N + 8  # floats per padded shared-memory row
MAX_GRID_Y = 65535  # row tiles a launch may have
LAYOUT_EPILOGUES = {"nn": ("", "bias_relu"), "nt": ("", "relu_gate")}  # the kernel's entries


def shared_bytes(tile_m: int, b_transposed: bool) -> int:
    """Dynamic shared memory of one block: STAGES x (A tile + B tile), padded rows."""
    b_floats = TILE_N * K_ROW if b_transposed else TILE_K * N_ROW
    return STAGES * (tile_m * K_ROW + b_floats) * 4


@functools.cache
def _module(device: int) -> cupy.RawModule:
    options = (*COMPILE_OPTIONS, f"--include-path={kernel_dir()}")
    return cupy.RawModule(code=KERNEL.read_text(), options=options)


@functools.cache
def _tile_kernel(device: int, name: str, tile_m: int, b_transposed: bool) -> cupy.RawKernel:
    kernel = _module(device).get_function(name)
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
    [K, N]), then its `epilogue` on `side`: "bias_relu" (nn only: max(· + side, 0), side [N])
    or "relu_gate" (nt only: · 1[side > 0], side [M, N]). `tile_m` (64 or 128 rows a block)
    defaults to 128 where that gives every multiprocessor a block, else 64 (twice the blocks,
    two per multiprocessor)."""
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
