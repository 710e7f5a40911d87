"""The narrow linear heads on CuPy (kernels/linear_heads.cu): policy, value and perception heads
on one input, up to LINEAR_HEADS_MAX in one launch, for heads too narrow for a GEMM to pay."""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from service.backend.cuda.launch import BLOCK, Array, KernelOps, strided_blocks
from service.backend.cuda.validate import F64 as _F64
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import int32 as _int32
from service.backend.cuda.validate import number as _number

__all__ = ["LinearHeadsOps"]

LINEAR_HEADS_MAX = 4  # linear_heads.cu: heads per launch
LINEAR_HEADS_TILE = 16  # linear_heads.cu: rows per tile (linear_heads_bwd_input's accumulators)
LINEAR_HEADS_MAX_COLUMNS = 512  # Σ head widths: a tile of gradients fits in SHARED_BYTES
LINEAR_HEADS_CHUNK_ROWS = 32  # rows per weight-gradient partial, at least; more rows when
LINEAR_HEADS_CHUNKS = 128  # that would make more partials than this
SHARED_BYTES = 48 * 1024  # dynamic shared memory a block may take without opting in


def _columns(name: str, widths: list[int]) -> None:
    if sum(widths) > LINEAR_HEADS_MAX_COLUMNS:
        raise ValueError(
            f"{name}: expected widths adding up to at most {LINEAR_HEADS_MAX_COLUMNS}, got "
            f"{widths} (the heads' columns are staged in shared memory)"
        )


def _slots(arrays: list[Array]) -> list[Array]:
    """`arrays` padded to LINEAR_HEADS_MAX pointer slots (the padding is never read)."""
    return arrays + [arrays[0]] * (LINEAR_HEADS_MAX - len(arrays))


def _widths(widths: list[int]) -> list[np.int32]:
    return [np.int32(w) for w in widths] + [np.int32(0)] * (LINEAR_HEADS_MAX - len(widths))


class LinearHeadsOps(KernelOps):
    """linear_heads_fwd, linear_heads_bwd_input and linear_heads_bwd_params."""

    def linear_heads_fwd(self, h: Array, Ws: Sequence[Array], bs: Sequence[Array]) -> list[Array]:
        """[h W_j + b_j for each head j]: up to LINEAR_HEADS_MAX heads in one launch
        (linear_heads.cu), for heads too narrow for a GEMM to pay."""
        h = self._head_input(h)
        Ws, widths = self._head_weights_and_widths(Ws)
        bs = list(bs)
        if len(bs) != len(Ws):
            raise ValueError(f"bs: expected {len(Ws)} arrays, got {len(bs)}")
        bs = [
            _array(f"bs[{j}]", b, shape=(w,))
            for j, (b, w) in enumerate(zip(bs, widths, strict=True))
        ]
        rows, columns, H = h.shape[0], sum(widths), self.dims.H
        outs = [cupy.empty((rows, w), dtype=cupy.float32) for w in widths]
        if rows:
            table = 8 * columns  # linear_heads_columns' head / col ints
            # One output per thread where S allows (at most LINEAR_HEADS_OUT always), and as
            # many features per stage as fit beside the tile (a multiple of 4).
            tile = max(1, min(LINEAR_HEADS_TILE, BLOCK // columns))
            fit = (SHARED_BYTES - table) // (4 * (tile + columns)) - 1
            k_chunk = min(-(-H // 4) * 4, fit // 4 * 4)
            self._kernel("linear_heads.cu", "linear_heads_fwd")(
                strided_blocks(rows, tile),
                (BLOCK,),
                (h, *_slots(Ws), *_slots(bs), *_slots(outs), *_widths(widths), np.int32(len(Ws)),
                 np.int32(rows), np.int32(tile), np.int32(k_chunk)),
                shared_mem=4 * (tile + columns) * (k_chunk + 1) + table,
            )  # fmt: skip
        return outs

    def linear_heads_bwd_input(
        self, Ws: Sequence[Array], grad_ys: Sequence[Array], weights: Sequence[float] | Array
    ) -> Array:
        """grad_h = Σ_j λ_j g_j W_jᵀ for the heads of `linear_heads_fwd` (linear_heads.cu): a
        tile of gradient rows in shared memory, each thread one feature with its W row in
        registers."""
        Ws, widths = self._head_weights_and_widths(Ws)
        rows, grad_ys, _ = self._head_gradients(grad_ys, widths)
        w = self._head_weights(weights, len(Ws))
        columns, H = sum(widths), self.dims.H
        grad_h = cupy.empty((rows, H), dtype=cupy.float32)
        if rows:
            self._kernel("linear_heads.cu", "linear_heads_bwd_input")(
                (*strided_blocks(rows, LINEAR_HEADS_TILE), -(-H // BLOCK)),
                (BLOCK,),
                (*_slots(grad_ys), *_slots(Ws), *_widths(widths), w, np.int32(len(Ws)), grad_h,
                 np.int32(rows)),
                shared_mem=4 * LINEAR_HEADS_TILE * columns + 8 * columns,
            )  # fmt: skip
        return grad_h

    def linear_heads_bwd_params(
        self, h: Array, grad_ys: Sequence[Array]
    ) -> tuple[list[Array], list[Array]]:
        """([grad_W_j = hᵀ g_j], [grad_b_j = Σ_b g_j]) for the heads of `linear_heads_fwd`
        (linear_heads.cu): fixed row-chunk partials, each chunk's gradients staged in shared
        memory, summed in chunk order."""
        h = self._head_input(h)
        rows, grad_ys, widths = self._head_gradients(grad_ys, None, rows=h.shape[0])
        H, count, columns = self.dims.H, np.int32(len(grad_ys)), sum(widths)
        grad_Ws = [cupy.empty((H, w), dtype=cupy.float32) for w in widths]
        grad_bs = [cupy.empty(w, dtype=cupy.float32) for w in widths]
        if not rows:  # nothing to sum: zero gradients, as hᵀ g and Σ_b g of no rows are
            for grad in grad_Ws + grad_bs:
                grad.fill(0)
            return grad_Ws, grad_bs
        table = 8 * columns  # linear_heads_columns' head / col ints
        chunk_rows = max(LINEAR_HEADS_CHUNK_ROWS, -(-rows // LINEAR_HEADS_CHUNKS))
        chunk_rows = min(chunk_rows, (SHARED_BYTES - table) // (4 * columns))
        chunks = -(-rows // chunk_rows)
        partials = cupy.empty((chunks, H + 1, columns), dtype=cupy.float32)
        self._kernel("linear_heads.cu", "linear_heads_grad_partials")(
            (chunks,),
            (min(-(-(H + 1) // 32) * 32, 1024),),  # one thread per feature, and the bias row
            (h, *_slots(grad_ys), *_widths(widths), count, np.int32(rows), np.int32(chunk_rows),
             partials),
            shared_mem=4 * chunk_rows * columns + table,
        )  # fmt: skip
        self._kernel("linear_heads.cu", "linear_heads_grad_reduce")(
            strided_blocks(partials[0].size),
            (BLOCK,),
            (partials, np.int32(chunks), *_widths(widths), count, *_slots(grad_Ws),
             *_slots(grad_bs)),
        )  # fmt: skip
        return grad_Ws, grad_bs

    def _head_input(self, h: Array) -> Array:
        H = self.dims.H
        h = _array("h", h, ndim=2)
        if h.shape[1] != H:
            raise ValueError(f"h: expected shape [rows, {H}], got {list(h.shape)}")
        _int32("h.shape[0]", h.shape[0])
        return h

    def _head_weights_and_widths(self, Ws: Sequence[Array]) -> tuple[list[Array], list[int]]:
        """The heads' checked W_j [H, w_j] and their widths (1 to LINEAR_HEADS_MAX heads)."""
        H = self.dims.H
        Ws = list(Ws)
        if not 1 <= len(Ws) <= LINEAR_HEADS_MAX:
            raise ValueError(f"Ws: expected 1 to {LINEAR_HEADS_MAX} arrays, got {len(Ws)}")
        Ws = [_array(f"Ws[{j}]", W, ndim=2) for j, W in enumerate(Ws)]
        for j, W in enumerate(Ws):
            if W.shape[0] != H or W.shape[1] < 1:
                raise ValueError(f"Ws[{j}]: expected shape [{H}, width >= 1], got {list(W.shape)}")
        widths = [W.shape[1] for W in Ws]
        _columns("Ws", widths)
        return Ws, widths

    def _head_gradients(
        self, grad_ys: Sequence[Array], widths: list[int] | None, rows: int | None = None
    ) -> tuple[int, list[Array], list[int]]:
        """(rows, the checked grad_ys [rows, w_j], their widths): widths as given (from the
        heads' W) or taken from grad_ys; rows as given (from h) or taken from grad_ys[0]."""
        grad_ys = list(grad_ys)
        expected = len(widths) if widths is not None else f"1 to {LINEAR_HEADS_MAX}"
        if not 1 <= len(grad_ys) <= LINEAR_HEADS_MAX or len(grad_ys) != len(widths or grad_ys):
            raise ValueError(f"grad_ys: expected {expected} arrays, got {len(grad_ys)}")
        checked = [_array(f"grad_ys[{j}]", g, ndim=2) for j, g in enumerate(grad_ys)]
        rows = checked[0].shape[0] if rows is None else rows
        given = widths is not None
        if widths is None:
            widths = [g.shape[1] for g in checked]
        for j, (g, w) in enumerate(zip(checked, widths, strict=True)):
            if g.shape[0] != rows or g.shape[1] != w or w < 1:
                want = f"[{rows}, {w}]" if given else f"[{rows}, width >= 1]"
                raise ValueError(f"grad_ys[{j}]: expected shape {want}, got {list(g.shape)}")
        _columns("grad_ys", widths)
        return rows, checked, widths

    def _head_weights(self, weights: Sequence[float] | Array, count: int) -> Array:
        """The heads' λ as a float64 device array [count] (numbers are uploaded)."""
        if isinstance(weights, cupy.ndarray):
            return _array("weights", weights, _F64, shape=(count,))
        values = list(weights)
        if len(values) != count:
            raise ValueError(f"weights: expected {count} numbers, got {len(values)}")
        return cupy.asarray([_number(f"weights[{i}]", v) for i, v in enumerate(values)])
