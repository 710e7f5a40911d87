"""Argument checks shared by the CuPy op wrappers (`core_ops`, `head_ops`).

CuPy checks nothing before a RawKernel launch, so every op checks dtype, shape and
C-contiguity first and raises ValueError naming the argument.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import cupy
import numpy as np

__all__ = ["F32", "FLAG_DTYPES", "array", "one", "scalar"]

F32 = (np.dtype(np.float32),)
FLAG_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))  # one byte, 0 / 1


def array(
    name: str,
    a: object,
    dtypes: Sequence[np.dtype] = F32,
    shape: tuple[int, ...] | None = None,
    ndim: int | None = None,
) -> cupy.ndarray:
    """`a` as a C-contiguous cupy array of one of `dtypes` (and `shape` / `ndim` if given)."""
    if not isinstance(a, cupy.ndarray):
        raise ValueError(f"{name}: expected a cupy.ndarray, got {type(a).__name__}")
    if a.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}: expected dtype {allowed}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {list(a.shape)}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")
    return a


def one(name: str, a: object, dtypes: Sequence[np.dtype]) -> cupy.ndarray:
    """A one-element device array (shape [1] or []) of one of `dtypes`: a counter, flag, norm."""
    arr = array(name, a, dtypes)
    if arr.size != 1 or arr.ndim > 1:
        raise ValueError(f"{name}: expected shape [1], got {list(arr.shape)}")
    return arr


def scalar(name: str, value: object) -> cupy.ndarray:
    """A float64 device scalar: a one-element float64 cupy array as is, a number uploaded."""
    if isinstance(value, cupy.ndarray):
        return one(name, value, (np.dtype(np.float64),))
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return cupy.asarray(np.array([float(value)], dtype=np.float64))
    raise ValueError(f"{name}: expected a number or a float64 cupy array, got {value!r}")
