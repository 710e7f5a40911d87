"""Argument checks shared by the CuPy op wrappers.

CuPy checks nothing before a RawKernel launch, so every op checks dtype, shape and
C-contiguity first and raises ValueError naming the argument. Sizes reach kernels as
np.int32 (`int32`): a Python int would become a `long long`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import cupy
import numpy as np

__all__ = [
    "F32",
    "F64",
    "FLAG_DTYPES",
    "I32",
    "array",
    "batch",
    "count",
    "counter",
    "flag",
    "int32",
    "key",
    "number",
    "one",
    "same",
    "scalar",
    "sequence",
    "sequence_value",
]

F32 = (np.dtype(np.float32),)
F64 = (np.dtype(np.float64),)
I32 = (np.dtype(np.int32),)
FLAG_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))  # one byte, 0 / 1
INT32_MAX = 2**31 - 1


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


def same(name: str, a: object, like: cupy.ndarray) -> cupy.ndarray:
    """`a` with `like`'s dtype and shape, C-contiguous."""
    return array(name, a, (like.dtype,), shape=like.shape)


def batch(
    name: str, a: object, trailing: tuple[int, ...], dtypes: Sequence[np.dtype] = F32
) -> tuple[cupy.ndarray, int]:
    """`a` of shape [B, *trailing] with 1 <= B < 2^31; returns (array, B)."""
    if isinstance(a, cupy.ndarray) and a.ndim == 1 + len(trailing) and a.shape[1:] == trailing:
        rows = a.shape[0]
        if not 1 <= rows <= INT32_MAX:
            raise ValueError(f"{name}: expected 1 to 2**31 - 1 rows, got {rows}")
        return array(name, a, dtypes), rows
    labels = ", ".join(["B", *(str(n) for n in trailing)])
    got = list(a.shape) if isinstance(a, cupy.ndarray) else type(a).__name__
    raise ValueError(f"{name}: expected a cupy.ndarray of shape [{labels}], got {got}")


def one(name: str, a: object, dtypes: Sequence[np.dtype]) -> cupy.ndarray:
    """A one-element device array (shape [1] or []) of one of `dtypes`: a counter, flag, norm."""
    arr = array(name, a, dtypes)
    if arr.size != 1 or arr.ndim > 1:
        raise ValueError(f"{name}: expected shape [1], got {list(arr.shape)}")
    return arr


def flag(name: str, a: object) -> cupy.ndarray:
    """A one-element uint8 / bool device flag (the non-finite guard's `ok`)."""
    return one(name, a, FLAG_DTYPES)


def counter(name: str, a: object) -> cupy.ndarray:
    """A one-element int64 device counter."""
    return one(name, a, (np.dtype(np.int64),))


def scalar(name: str, value: object) -> cupy.ndarray:
    """A float64 device scalar: a one-element float64 cupy array as is, a number uploaded."""
    if isinstance(value, cupy.ndarray):
        return one(name, value, F64)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return cupy.asarray(np.array([float(value)], dtype=np.float64))
    raise ValueError(f"{name}: expected a number or a float64 cupy array, got {value!r}")


def number(name: str, value: object) -> float:
    """A host number (not a bool) as a float."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{name}: expected a number, got {value!r}")


def count(name: str, value: object, minimum: int = 1) -> int:
    """An int in [minimum, 2^31): a size a kernel takes as `int`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if not minimum <= int(value) <= INT32_MAX:
        raise ValueError(f"{name}: expected an int in [{minimum}, 2**31), got {value}")
    return int(value)


def int32(name: str, value: object, minimum: int = 0) -> np.int32:
    """`count`'s int as the np.int32 a kernel's `int` argument needs."""
    return np.int32(count(name, value, minimum))


def key(name: str, value: object) -> cupy.ndarray:
    """The Philox key as uint32 [2] in device memory: as is, or a (low, high) pair uploaded."""
    if isinstance(value, cupy.ndarray):
        return array(name, value, (np.dtype(np.uint32),), shape=(2,))
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(w, numbers.Integral) and 0 <= int(w) < 2**32 for w in value)
    ):
        return cupy.asarray(np.array([int(w) for w in value], dtype=np.uint32))
    raise ValueError(
        f"{name}: expected a (low, high) pair of uint32 words or a uint32 cupy array [2], "
        f"got {value!r}"
    )


def _sequence_number(value: object) -> int | None:
    """`value` as an int in [0, 2**63) (a Philox sequence number), else None."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return None
    return int(value) if 0 <= int(value) < 2**63 else None


def sequence(name: str, value: object) -> cupy.ndarray:
    """A Philox sequence as int64 [1] in device memory: a counter as is, an int uploaded."""
    if isinstance(value, cupy.ndarray):
        return counter(name, value)
    number = _sequence_number(value)
    if number is not None:
        return cupy.asarray(np.array([number], dtype=np.int64))
    raise ValueError(
        f"{name}: expected an int in [0, 2**63) or an int64 cupy array [1], got {value!r}"
    )


def sequence_value(name: str, value: object) -> int:
    """A Philox sequence number given on the host, as an int in [0, 2**63)."""
    number = _sequence_number(value)
    if number is not None:
        return number
    raise ValueError(f"{name}: expected an int in [0, 2**63), got {value!r}")
