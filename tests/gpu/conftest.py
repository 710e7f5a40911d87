"""GPU tests: every test under tests/gpu/ is marked `gpu` and skipped where CuPy sees no device.

Kernels compile into a fresh cache directory per session, so a run never reuses a cubin
from an earlier checkout.

Also the helpers the GPU test modules share, imported with `from .conftest import ...` (dev, host,
normal, assert_close, same_bytes, TOL); the `rng` fixture is tests/conftest.py's. CuPy is imported
inside the helpers, so this file loads (and the skip logic runs) where CuPy is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    import cupy

HERE = Path(__file__).resolve().parent
NO_DEVICE = "no CUDA device visible to CuPy"


def cuda_unavailable_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    try:
        import cupy
    except ImportError:
        return f"{NO_DEVICE} (cupy is not installed)"
    try:
        available = bool(cupy.cuda.is_available())
    except Exception as exc:  # a broken driver or runtime counts as no device
        return f"{NO_DEVICE} ({type(exc).__name__}: {exc})"
    return None if available else NO_DEVICE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = cuda_unavailable_reason()
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private TRIDENT_KERNEL_CACHE for the session."""
    from service.backend.cuda.loader import CACHE_DIR_ENV

    path = tmp_path_factory.mktemp("kernel-cache")
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(path)
    yield path
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


# --------------------------------------------------------------------------- shared helpers
TOL = 1e-5  # max |gpu - numpy| / scale, per tensor


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def dev(a: np.ndarray) -> cupy.ndarray:
    import cupy

    return cupy.asarray(a)


def host(a: cupy.ndarray) -> np.ndarray:
    import cupy

    return cupy.asnumpy(a)


def assert_close(got: cupy.ndarray, want: np.ndarray, scale: float | None = None) -> None:
    """max |got - want| / scale < TOL (scale defaults to max |want|), same shape and dtype."""
    got_h, want = host(got), np.asarray(want)
    assert got_h.shape == want.shape, (got_h.shape, want.shape)
    assert got_h.dtype == want.dtype, (got_h.dtype, want.dtype)
    if want.size == 0:
        return
    assert np.all(np.isfinite(got_h)), "non-finite output"
    if scale is None:
        scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got_h.astype(np.float64) - want.astype(np.float64))))
    assert err / max(scale, 1e-30) < TOL, f"error {err:.3g} on scale {scale:.3g}"


def same_bytes(a: object, b: object) -> bool:
    """Same shape, dtype and bytes; each of a, b a cupy or NumPy array."""
    a_h, b_h = host(a), host(b)
    return a_h.shape == b_h.shape and a_h.dtype == b_h.dtype and a_h.tobytes() == b_h.tobytes()
