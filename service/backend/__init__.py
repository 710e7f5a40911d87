"""Compute backends: one op set (see `numpy_ops`), one implementation per device kind.

`backend/` knows arrays and math, nothing of RL. The NumPy module is the reference: every
other backend provides the same op names with the same signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from service.backend import numpy_ops
from service.backend.cuda.loader import KERNEL_ABI_VERSION, CudaDims
from service.backend.executor import Executor, HostScalars, NumpyExecutor, Scalars
from service.backend.host_memory import retain_freed_memory
from service.errors import BackendUnavailable

BACKEND_CHOICES = ("auto", "numpy", "cuda")


@dataclass(frozen=True)
class Backend:
    """A named op-set implementation, its array module and the device it runs on."""

    name: str
    device: str
    ops: Any  # numpy_ops, or an object with the same op names and signatures
    xp: ModuleType  # numpy or cupy: arrays the ops take and return
    to_host: Callable[[Any], np.ndarray]
    # A host array on the device, queued on the current stream: asynchronous from `host_empty`
    # memory, which must then stay unchanged until the stream has passed the copy.
    to_device: Callable[[np.ndarray], Any]
    host_empty: Callable[[tuple[int, ...], Any], np.ndarray]  # host arrays to_device reads fastest
    # A device array into the host array `out`, queued on the current stream: asynchronous into
    # `host_empty` memory, so `out` is read after the executor synchronizes.
    copy_to_host: Callable[[Any, np.ndarray], None]
    # A new executor for one trainer: graphs on or off, and `urgent` (its device work
    # scheduled ahead of other executors', where the device has priorities: Act's).
    executor: Callable[[bool, bool], Executor]
    scalars: Callable[[np.ndarray], Scalars]  # a settings vector, read as the ops take it
    kernel_abi_version: int = 0  # of the loaded CUDA kernels; 0 for NumPy


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def _numpy_backend() -> Backend:
    retain_freed_memory()
    return Backend(
        name="numpy",
        device="cpu",
        ops=numpy_ops,
        xp=np,
        to_host=np.asarray,
        to_device=np.ascontiguousarray,
        host_empty=np.empty,
        copy_to_host=lambda device, out: np.copyto(out, device),
        executor=lambda graphs, urgent: NumpyExecutor(),
        scalars=HostScalars,
    )


def _cuda_backend(dims: Mapping[str, int], precision: str) -> Backend:
    import cupy

    from service.backend.cuda.executor import CudaExecutor, DeviceScalars, empty_pinned, upload
    from service.backend.cuda.ops import CudaOps

    ops = CudaOps(CudaDims(**dims), precision)
    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    return Backend(
        name="cuda",
        device=device,
        ops=ops,
        xp=cupy,
        to_host=cupy.asnumpy,
        to_device=upload,
        host_empty=empty_pinned,
        copy_to_host=lambda device, out: cupy.asnumpy(device, out=out, blocking=False),
        executor=CudaExecutor,
        scalars=DeviceScalars,
        kernel_abi_version=KERNEL_ABI_VERSION,
    )


def resolve_name(name: str) -> str:
    """The backend `train.backend` names: 'auto' is 'cuda' where CuPy sees a GPU, else 'numpy'."""
    if name == "auto":
        return "cuda" if cuda_available() else "numpy"
    return name


def require_cuda() -> None:
    """BackendUnavailable, saying what to install, unless CuPy sees a CUDA device."""
    if not cuda_available():
        raise BackendUnavailable(
            "train.backend: 'cuda' needs CuPy (pip install '.[cuda]' in Trident's checkout) "
            "and a CUDA device it can see; none is visible here"
        )


def select_backend(name: str, dims: Mapping[str, int], precision: str = "fp32") -> Backend:
    """The backend for `train.backend`: 'numpy', 'cuda', or 'auto' (`resolve_name`).

    `dims` (D, H, A, Z, K) are the model's sizes; the CUDA kernels are compiled for them.
    `precision` (train.precision) is the CUDA GEMMs'; NumPy computes in fp32 (or float64).
    """
    name = resolve_name(name)
    if name == "numpy":
        if precision != "fp32":
            raise BackendUnavailable(
                f"train.precision: {precision!r} runs on the cuda backend's tensor cores; "
                "expected 'fp32' on numpy"
            )
        return _numpy_backend()
    if name == "cuda":
        require_cuda()
        return _cuda_backend(dims, precision)
    raise BackendUnavailable(f"train.backend: expected one of {BACKEND_CHOICES}, got {name!r}")
