"""The CUDA backend: `kernels/*.cu` compiled by NVRTC through CuPy and wrapped as ops.

`loader` finds, compiles, caches and loads kernels and needs CuPy only when it loads one. The
ops import CuPy: one module per kernel concern (`linear`, `linear_heads`, `encoder`, `c51`,
`ppo`, `value`, `perception`, `gae`, `grad_norm_clip`, `optim`, `tensor_table`, `step_stats`,
`act`, `replay`), each a mixin of `launch.KernelOps`, composed by `ops.CudaOps`; `launch`
sizes grids and launches, `validate` checks arguments, `gemm` calls cuBLAS.
"""

from service.backend.cuda.loader import (
    COMPILE_OPTIONS,
    KERNEL_ABI_VERSION,
    KERNEL_DIR,
    CudaDims,
    KernelSourceMissing,
    cache_key,
    load_kernel,
)

__all__ = [
    "COMPILE_OPTIONS",
    "KERNEL_ABI_VERSION",
    "KERNEL_DIR",
    "CudaDims",
    "KernelSourceMissing",
    "cache_key",
    "load_kernel",
]
