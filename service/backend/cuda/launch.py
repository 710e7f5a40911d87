"""What every CuPy op wrapper shares: grid sizing, the kernels of one model size, launches.

Each op module (`linear`, `encoder`, `c51`, ...) holds a mixin of `KernelOps` named for its
kernels; `ops.CudaOps` is all of them. A kernel is launched with one of two grids:

- `blocks(n)`: every item its own thread (kernels indexed by `blockIdx.x * blockDim.x +
  threadIdx.x` alone); never capped, so it may have up to 2^31 / BLOCK blocks.
- `strided_blocks(n)`: at most MAX_BLOCKS blocks, for kernels whose grid-stride loop covers the
  items past the grid. Each item is computed by the same arithmetic whichever thread takes it,
  so the cap changes no output bit.

Hyper-parameters (lr, β, ε, wd, γ, λ, τ, max_norm, head weights, PPO's ε and c_ent, Act's ε)
reach the kernels as float64 device scalars (`validate.scalar`). Each accepts a Python
number, uploaded per call (the twin's interface), or a float64 cupy array of one element (a
slice of a device hyper-parameter vector): the form to use inside a captured CUDA graph,
where nothing may be uploaded. Likewise the Philox key (uint32 [2], (seed low, seed high))
and sequence (int64 [1], a counter).
"""

from __future__ import annotations

from typing import TypeAlias

import cupy

from service.backend.cuda.loader import CudaDims, load_kernel

__all__ = [
    "BLOCK",
    "MAX_BLOCKS",
    "REDUCE_THREADS",
    "Array",
    "KernelOps",
    "Scalar",
    "blocks",
    "scalar_out",
    "strided_blocks",
]

Array: TypeAlias = cupy.ndarray
Scalar: TypeAlias = float | cupy.ndarray

BLOCK = 256  # threads per block of the element and row kernels (common.cuh: TRIDENT_BLOCK)
MAX_BLOCKS = 1 << 20  # grid cap of the grid-stride kernels
REDUCE_THREADS = 256  # the block of the single-block, fixed-order reductions


def blocks(n: int, per_block: int = BLOCK) -> tuple[int]:
    """ceil(n / per_block) blocks: one thread (or tile) per item, every item in the grid."""
    return (-(-n // per_block),)


def strided_blocks(n: int, per_block: int = BLOCK) -> tuple[int]:
    """`blocks(n, per_block)` capped at MAX_BLOCKS (at least 1), for grid-stride kernels."""
    return (max(1, min(-(-n // per_block), MAX_BLOCKS)),)


def scalar_out() -> Array:
    """A 0-d float32 device array for a batch loss or statistic: nothing is read back to the
    host, so an op never waits for a GPU result."""
    return cupy.empty((), dtype=cupy.float32)


class KernelOps:
    """The kernels of `kernels/*.cu` compiled for `dims` (loaded on first use, then cached)."""

    def __init__(self, dims: CudaDims) -> None:
        self.dims = dims
        self.precision = "fp32"  # of the cuBLAS GEMMs (gemm.py; CudaOps sets it); kernels: fp32
        self._defines = dims.defines()

    def _kernel(self, file: str, name: str) -> cupy.RawKernel:
        return load_kernel(file, name, self._defines)

    def _launch(self, file: str, name: str, threads: int, args: tuple) -> None:
        """`threads` threads of `name`, one per item, in BLOCK-sized blocks (none for 0)."""
        if threads > 0:
            self._kernel(file, name)(blocks(threads), (BLOCK,), args)

    def _reduce(self, file: str, name: str, args: tuple) -> None:
        """A single-block fixed-order reduction kernel (REDUCE_THREADS threads)."""
        self._kernel(file, name)((1,), (REDUCE_THREADS,), args)
