"""Tensor messages <-> NumPy arrays: raw little-endian bytes, read with `np.frombuffer`."""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from service.api.trident.v1 import trainer_pb2 as pb
from service.errors import InvalidInput

DTYPES: dict[int, np.dtype] = {
    pb.D_TYPE_FLOAT32: np.dtype("<f4"),
    pb.D_TYPE_FLOAT64: np.dtype("<f8"),
    pb.D_TYPE_INT32: np.dtype("<i4"),
    pb.D_TYPE_INT64: np.dtype("<i8"),
    pb.D_TYPE_UINT8: np.dtype("u1"),
    pb.D_TYPE_BOOL: np.dtype("?"),
}
CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}


def dtype_name(code: int) -> str:
    return pb.DType.Name(code) if code in pb.DType.values() else f"unknown DType {code}"


def _shape_text(shape: tuple[int, ...]) -> str:
    """A shape for an error message, cut short when it has many dimensions."""
    text = str(list(shape[:16]))
    return text if len(shape) <= 16 else f"{text[:-1]}, ...] ({len(shape)} dimensions)"


def encode(array: np.ndarray) -> pb.Tensor:
    """A Tensor message holding `array` (converted to little-endian, C order)."""
    array = np.asarray(array)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    code = CODES.get(np.dtype(dtype))
    if code is None:
        raise InvalidInput("tensor", f"a dtype among {[str(d) for d in CODES]}", str(array.dtype))
    data = np.ascontiguousarray(array, dtype=dtype).tobytes()
    return pb.Tensor(shape=list(array.shape), dtype=code, data=data)


def decode(tensor: pb.Tensor, field: str, allowed: Collection[int]) -> np.ndarray:
    """The array a Tensor message holds, or InvalidInput naming `field`.

    Checks the dtype against `allowed`, every dimension for being non-negative, the byte length
    against prod(shape) · itemsize, and bool bytes for being 0 or 1. The result is a read-only
    view of the message's bytes.
    """
    if tensor.dtype not in allowed:
        names = ", ".join(dtype_name(code) for code in allowed)
        raise InvalidInput(f"{field}.dtype", f"one of {names}", dtype_name(tensor.dtype))
    shape = tuple(tensor.shape)
    if any(dim < 0 for dim in shape):
        raise InvalidInput(f"{field}.shape", "non-negative dimensions", list(shape))
    dtype = DTYPES[tensor.dtype]
    expected = math.prod(shape) * dtype.itemsize
    data = tensor.data  # a copy of the message's bytes on every read: read once
    if len(data) != expected:
        raise InvalidInput(
            f"{field}.data",
            f"{expected} bytes for shape {list(shape)} of {dtype_name(tensor.dtype)}",
            f"{len(data)} bytes",
        )
    try:
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError:
        # A zero-size shape passes the byte-length check whatever its other dimensions are, but
        # NumPy refuses more than 64 dimensions or a size*itemsize beyond intp with a
        # ValueError, which would be answered INTERNAL; it is the caller's shape that is wrong.
        raise InvalidInput(
            f"{field}.shape",
            "at most 64 dimensions whose product times the item size fits in 63 bits",
            _shape_text(shape),
        ) from None
    if dtype.kind == "b" and np.any(array.view(np.uint8) > 1):
        raise InvalidInput(f"{field}.data", "bool bytes of 0 or 1", "other byte values")
    return array
