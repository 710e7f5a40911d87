"""Multi-tensor launches on CuPy: tables of tensor addresses (kernels/tensor_table.cu) and
common.cuh's block layout, so one launch covers up to MAX_TENSORS tensors of any sizes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import cupy
import numpy as np

from service.backend.cuda.launch import Array, KernelOps
from service.backend.cuda.loader import CudaDims

__all__ = ["MAX_TENSORS", "TensorTableOps", "groups"]

MAX_TENSORS = 16  # common.cuh: TRIDENT_MAX_TENSORS, tensors per multi-tensor launch

T = TypeVar("T")


def groups(items: list[T]) -> list[list[T]]:
    """`items` in runs of at most MAX_TENSORS (one multi-tensor launch each)."""
    return [items[i : i + MAX_TENSORS] for i in range(0, len(items), MAX_TENSORS)]


@dataclass(frozen=True)
class Layout:
    """A multi-tensor launch's grid size and its (block_offsets, sizes, count, chunk) args."""

    blocks: int
    args: tuple


class TensorTableOps(KernelOps):
    """The address tables and block layouts of multi-tensor launches, uploaded once each."""

    def __init__(self, dims: CudaDims) -> None:
        super().__init__(dims)
        self._tables: dict[tuple[int, ...], Array] = {}
        self._layouts: dict[tuple[tuple[int, ...], int], Layout] = {}

    def _table(self, arrays: Sequence[Array], persistent: bool = True) -> Array:
        """uint64 [len(arrays)] addresses on the device.

        `persistent`: the arrays live as long as the trainer and never move (parameters,
        moments, counters, hyper-parameter slices): their table is uploaded once and reused.
        Otherwise (gradients, fresh every update) tensor_table.cu writes the table on the
        device, so it works inside a captured graph, where nothing may be uploaded.
        """
        addresses = tuple(a.data.ptr for a in arrays)
        table = self._tables.get(addresses) if persistent else None
        if table is not None:
            return table
        if persistent and not cupy.cuda.get_current_stream().is_capturing():
            table = self._tables[addresses] = cupy.asarray(np.array(addresses, np.uint64))
            return table
        table = cupy.empty(len(addresses), dtype=cupy.uint64)
        padded = [np.uint64(a) for a in addresses] + [np.uint64(0)] * (MAX_TENSORS - len(arrays))
        self._kernel("tensor_table.cu", "tensor_table")(
            (1,), (1,), (table, np.int32(len(arrays)), *padded)
        )
        return table

    def _layout(self, sizes: Sequence[int], chunk: int) -> Layout:
        """common.cuh's multi-tensor block layout for tensors of `sizes` (uploaded once)."""
        key = (tuple(sizes), chunk)
        layout = self._layouts.get(key)
        if layout is None:
            if cupy.cuda.get_current_stream().is_capturing():
                raise RuntimeError("a new multi-tensor layout while capturing: run eagerly first")
            blocks = np.cumsum([0] + [-(-n // chunk) for n in sizes]).astype(np.int64)
            args = (
                cupy.asarray(blocks),
                cupy.asarray(np.array(sizes, dtype=np.int64)),
                np.int32(len(sizes)),
                np.int64(chunk),
            )
            layout = self._layouts[key] = Layout(int(blocks[-1]), args)
        return layout
