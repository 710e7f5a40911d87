"""The CUDA backend: `kernels/*.cu` compiled by NVRTC through CuPy and wrapped as ops.

`loader` finds, compiles, caches and loads kernels and needs CuPy only when it loads one;
`core_ops.CoreOps` (and `head_ops.HeadOps`) import CuPy and hold the ops; `validate` holds
the argument checks they share.
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
