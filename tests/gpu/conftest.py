"""GPU tests: every test under tests/gpu/ is marked `gpu` and skipped where CuPy sees no device.

Kernels compile into a fresh cache directory per session, so a run never reuses a cubin
from an earlier checkout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
