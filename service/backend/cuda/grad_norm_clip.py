"""The non-finite guard, gradient norms and clip coefficients on CuPy
(kernels/grad_norm_clip.cu): per-chunk partials in a fixed order, then one fixed-shape
reduction, so the same gradients give the same bits on every run (no atomics)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import cupy
import numpy as np

from service.backend.cuda.launch import REDUCE_THREADS, Array, Scalar
from service.backend.cuda.loader import CudaDims
from service.backend.cuda.tensor_table import TensorTableOps, groups
from service.backend.cuda.validate import F64 as _F64
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import int32 as _int32
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["GradNormClipOps"]

REDUCE_CHUNK = 2048  # grad_norm_clip.cu: TRIDENT_REDUCE_CHUNK (threads x items)
FINITE_SMALL = 8  # grad_norm_clip.cu: TRIDENT_FINITE_SMALL, arrays all_finite_finalize checks
FINITE_SMALL_MAX = 1024  # grad_norm_clip.cu: TRIDENT_FINITE_SMALL_MAX, elements of such an array


class GradNormClipOps(TensorTableOps):
    """all_finite, global_norm, group_norms and clip_coefficient."""

    def __init__(self, dims: CudaDims) -> None:
        super().__init__(dims)
        self._group_offsets: dict[tuple[tuple[int, ...], tuple[int, ...]], Array] = {}

    def all_finite(self, arrays: Sequence[Array]) -> Array:
        """ok = [1] when every entry of every array is finite, else [0] (uint8 [1]).

        float32 and float64 arrays are checked; integer and bool arrays are finite by type.
        """
        floats: list[Array] = []
        for i, a in enumerate(arrays):
            if not isinstance(a, cupy.ndarray):
                raise ValueError(f"arrays[{i}]: expected a cupy.ndarray, got {type(a).__name__}")
            if a.dtype.kind in "biu":
                continue
            floats.append(_array(f"arrays[{i}]", a, (np.dtype(np.float32), np.dtype(np.float64))))
        # The first FINITE_SMALL arrays of at most FINITE_SMALL_MAX elements (the losses, the
        # norm, the guard) are checked by the final kernel itself; the others by chunk first.
        small = [a for a in floats if a.size <= FINITE_SMALL_MAX][:FINITE_SMALL]
        large = [a for a in floats if all(a is not b for b in small)]
        counts = [-(-a.size // REDUCE_CHUNK) for a in large]
        flags = cupy.empty(max(1, sum(counts)), dtype=cupy.uint8)
        offset = 0
        for a, count in zip(large, counts, strict=True):
            if count:
                name = "finite_partials_f32" if a.dtype == np.float32 else "finite_partials_f64"
                self._kernel("grad_norm_clip.cu", name)(
                    (count,), (REDUCE_THREADS,), (a, np.int64(a.size), flags[offset:])
                )
            offset += count
        ok = cupy.empty(1, dtype=cupy.uint8)
        slots = small + [ok] * (FINITE_SMALL - len(small))  # unused slots: never read
        sizes = [np.int64(a.size) for a in small] + [np.int64(0)] * (FINITE_SMALL - len(small))
        f64_mask = sum(1 << j for j, a in enumerate(small) if a.dtype == np.float64)
        self._kernel("grad_norm_clip.cu", "all_finite_finalize")(
            (1,),
            (REDUCE_THREADS,),
            (flags, np.int64(offset), *slots, *sizes, np.int32(f64_mask), np.int32(len(small)),
             ok),
        )  # fmt: skip
        return ok

    def global_norm(self, grads: Sequence[Array]) -> Array:
        """‖g‖ = sqrt(Σ_tensors Σ g²) in float64, tensors in the order given; float64 [1].

        Per-chunk partials (fixed order) for every tensor, laid out one tensor after another,
        then one fixed-shape reduction: deterministic, no atomics (grad_norm_clip.cu).
        """
        partials, counts = self._sumsq_partials(grads)
        norm = cupy.empty(1, dtype=cupy.float64)
        self._kernel("grad_norm_clip.cu", "sumsq_finalize")(
            (1,), (REDUCE_THREADS,), (partials, np.int64(sum(counts)), norm)
        )
        return norm

    def group_norms(self, grads: Sequence[Array], group_sizes: Sequence[int]) -> Array:
        """The norm of each group of consecutive tensors (`group_sizes[j]` tensors in group j),
        then global_norm(grads) (the same bits) as the last entry: float64 [G + 1], from one
        set of partials and one launch of sumsq_group_finalize."""
        sizes = [int(_int32(f"group_sizes[{j}]", n)) for j, n in enumerate(group_sizes)]
        if sum(sizes) != len(grads):
            raise ValueError(f"group_sizes: expected sizes summing to {len(grads)}, got {sizes}")
        partials, counts = self._sumsq_partials(grads)
        key = (tuple(counts), tuple(sizes))
        offsets = self._group_offsets.get(key)
        if offsets is None:  # uploaded once per layout, outside any capture (run eagerly first)
            if cupy.cuda.get_current_stream().is_capturing():
                raise RuntimeError("a new group layout while capturing: run eagerly first")
            bounds = np.cumsum([0, *sizes])
            per_group = [sum(counts[a:b]) for a, b in itertools.pairwise(bounds)]
            offsets = self._group_offsets[key] = cupy.asarray(np.cumsum([0, *per_group]))
        norms = cupy.empty(len(sizes) + 1, dtype=cupy.float64)
        self._kernel("grad_norm_clip.cu", "sumsq_group_finalize")(
            (len(sizes) + 1,), (REDUCE_THREADS,), (partials, offsets, np.int32(len(sizes)), norms)
        )
        return norms

    def _sumsq_partials(self, grads: Sequence[Array]) -> tuple[Array, list[int]]:
        """Per-chunk Σg² partials (fixed order) of every tensor, laid out one tensor after
        another, and each tensor's count of partials (grad_norm_clip.cu)."""
        checked = [_array(f"grads[{i}]", g) for i, g in enumerate(grads)]
        counts = [-(-g.size // REDUCE_CHUNK) for g in checked]
        partials = cupy.empty(max(1, sum(counts)), dtype=cupy.float64)
        offset = 0
        kernel = self._kernel("grad_norm_clip.cu", "sumsq_partials_multi")
        for group in groups([g for g in checked if g.size]):  # one launch per 16 tensors
            layout = self._layout([g.size for g in group], REDUCE_CHUNK)
            kernel(
                (layout.blocks,),
                (REDUCE_THREADS,),
                (self._table(group, persistent=False), *layout.args, partials[offset:]),
            )
            offset += layout.blocks
        return partials, counts

    def clip_coefficient(self, norm: Array, max_norm: Scalar) -> Array:
        """min(1, max_norm / (‖g‖ + 1e-6)) for each norm of a float64 [n] array (torch's
        clip_grad_norm_), as float64 [n]."""
        norm = _array("norm", norm, _F64, ndim=1)
        coef = cupy.empty(norm.shape, dtype=cupy.float64)
        self._kernel("grad_norm_clip.cu", "clip_coefficient")(
            (1,), (1,), (norm, _scalar("max_norm", max_norm), coef, np.int64(norm.size))
        )
        return coef
