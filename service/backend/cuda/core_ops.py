"""The core ops on CuPy: encoder epilogues, reductions, optimizer, clipping, target refresh, GAE.

`CoreOps(dims)` has one method per op, with the name and parameter names of its NumPy twin
in `service/backend/numpy_ops.py`, so an instance passes `check_op_set` for these ops (the
head ops come from `head_ops.HeadOps`). Every method checks dtype, shape and C-contiguity
before launching (CuPy checks nothing) and raises ValueError naming the argument; scalars go
to kernels as np.int32 / np.int64, never as Python ints.

Hyper-parameters (lr, β, ε, wd, γ, λ, τ, max_norm, head weights) reach the kernels as float64
device scalars. Each accepts a Python number, uploaded per call (the twin's interface), or a
float64 cupy array of one element (a slice of a device hyper-parameter vector): the form to
use inside a captured CUDA graph, where nothing may be uploaded.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import cupy
import numpy as np

from service.backend.cuda.gemm import gemm
from service.backend.cuda.loader import CudaDims, load_kernel
from service.backend.cuda.validate import FLAG_DTYPES as _FLAG_DTYPES
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import one as _one
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["CoreOps", "CudaDims"]

Array = cupy.ndarray
Scalar = float | cupy.ndarray

BLOCK = 256  # threads per block of the element-wise kernels (TRIDENT_BLOCK)
MAX_BLOCKS = 1 << 20  # grid cap for grid-stride kernels
REDUCE_THREADS = 256  # grad_norm_clip.cu: TRIDENT_REDUCE_THREADS
REDUCE_CHUNK = 2048  # grad_norm_clip.cu: TRIDENT_REDUCE_CHUNK (threads x items)
FINITE_SMALL = 8  # grad_norm_clip.cu: TRIDENT_FINITE_SMALL, arrays all_finite_finalize checks
FINITE_SMALL_MAX = 1024  # grad_norm_clip.cu: TRIDENT_FINITE_SMALL_MAX, elements of such an array
SINGLE_PASS_MAX_ROWS = 1024  # reduce_axis0: above this, fixed row chunks first
CHUNK_ROWS = 64  # reduce_axis0_partials: rows summed per partial
LINEAR_HEADS_MAX = 4  # linear_heads.cu: heads per launch
LINEAR_HEADS_TILE = 16  # linear_heads.cu: rows per tile (linear_heads_bwd_input's accumulators)
LINEAR_HEADS_MAX_COLUMNS = 512  # Σ head widths: a tile of gradients fits in SHARED_BYTES
LINEAR_HEADS_CHUNK_ROWS = 32  # rows per weight-gradient partial, at least; more rows when
LINEAR_HEADS_CHUNKS = 128  # that would make more partials than this
SHARED_BYTES = 48 * 1024  # dynamic shared memory a block may take without opting in
MAX_TENSORS = 16  # common.cuh: TRIDENT_MAX_TENSORS, tensors per multi-tensor launch
MULTI_CHUNK = 4 * BLOCK  # elements per block of adamw_multi and target_refresh_multi
STEP_STATS, STEP_NORM = 10, 5  # step_stats.cu: statistics per update, the float64 one


# --------------------------------------------------------------------------- validation
# _array, _one, _scalar and _FLAG_DTYPES are service/backend/cuda/validate.py's, shared with
# head_ops.
def _same(name: str, a: object, like: Array) -> Array:
    """`a` with `like`'s dtype and shape, C-contiguous."""
    return _array(name, a, (like.dtype,), shape=like.shape)


def _flag(name: str, a: object) -> Array:
    return _one(name, a, _FLAG_DTYPES)


def _counter(name: str, a: object) -> Array:
    return _one(name, a, (np.dtype(np.int64),))


def _int32(name: str, value: int, minimum: int = 0) -> np.int32:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if not minimum <= int(value) < 2**31:
        raise ValueError(f"{name}: expected an int in [{minimum}, 2**31), got {value}")
    return np.int32(value)


def _vec(H: int) -> int:
    """Elements per thread step of encoder.cu (ENCODER_VEC)."""
    return 4 if H % 4 == 0 else 1


def _aligned(H: int, **arrays: Array) -> None:
    """encoder.cu reads float4s when H % 4 == 0: each array must start on 16 bytes."""
    for name, a in arrays.items():
        if _vec(H) == 4 and a.data.ptr % 16:
            raise ValueError(f"{name}: expected an array starting on a 16-byte boundary")


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


def _groups(items: list) -> list[list]:
    """`items` in runs of at most MAX_TENSORS (one multi-tensor launch each)."""
    return [items[i : i + MAX_TENSORS] for i in range(0, len(items), MAX_TENSORS)]


@dataclass(frozen=True)
class _Layout:
    """A multi-tensor launch's grid size and its (block_offsets, sizes, count, chunk) args."""

    blocks: int
    args: tuple


def _blocks(n: int, per_block: int = BLOCK) -> tuple[int]:
    return (max(1, min(-(-n // per_block), MAX_BLOCKS)),)


class CoreOps:
    """The core op set, with kernels compiled for `dims` (loaded on first use, then cached)."""

    def __init__(self, dims: CudaDims) -> None:
        self.dims = dims
        self.__name__ = f"{type(self).__module__}.CoreOps"  # check_op_set's messages use it
        self._defines = dims.defines()
        self._tables: dict[tuple[int, ...], Array] = {}
        self._layouts: dict[tuple, _Layout] = {}

    def _kernel(self, file: str, name: str) -> cupy.RawKernel:
        return load_kernel(file, name, self._defines)

    # ----------------------------------------------------------------------- linear layers
    def matmul(self, a: Array, b: Array) -> Array:
        """a @ b for a [M, K], b [K, N] (cuBLAS SGEMM, capturable: see gemm.py)."""
        a = _array("a", a, ndim=2)
        b = _array("b", b, ndim=2)
        if b.shape[0] != a.shape[1]:
            raise ValueError(f"b: expected shape [{a.shape[1]}, N], got {list(b.shape)}")
        return gemm(a, b)

    def linear_fwd(self, x: Array, W: Array, b: Array) -> Array:
        """y = x W + b for x [B, I], W [I, O], b [O] (cuBLAS SGEMM, then the bias add)."""
        x = _array("x", x, ndim=2)
        W = _array("W", W, ndim=2)
        if W.shape[0] != x.shape[1]:
            raise ValueError(f"W: expected shape [{x.shape[1]}, O], got {list(W.shape)}")
        b = _array("b", b, shape=(W.shape[1],))
        y = gemm(x, W)
        y += b
        return y

    def linear_bwd(self, x: Array, W: Array, grad_y: Array) -> tuple[Array, Array, Array]:
        """(grad_x = g Wᵀ, grad_W = xᵀ g, grad_b = Σ_b g) of y = x W + b."""
        grad_x = self.linear_bwd_input(W, grad_y)
        return (grad_x, *self.linear_bwd_params(x, grad_y))

    def linear_bwd_input(self, W: Array, grad_y: Array) -> Array:
        """grad_x = g Wᵀ (cuBLAS SGEMM): the input half of `linear_bwd`."""
        W = _array("W", W, ndim=2)
        grad_y = _array("grad_y", grad_y, ndim=2)
        if grad_y.shape[1] != W.shape[1]:
            raise ValueError(f"grad_y: expected shape [B, {W.shape[1]}], got {list(grad_y.shape)}")
        return gemm(grad_y, W, trans_b=True)

    def linear_bwd_params(self, x: Array, grad_y: Array) -> tuple[Array, Array]:
        """(grad_W = xᵀ g, grad_b = Σ_b g): the parameter half of `linear_bwd`."""
        x = _array("x", x, ndim=2)
        grad_y = _array("grad_y", grad_y, ndim=2)
        if grad_y.shape[0] != x.shape[0]:
            raise ValueError(f"grad_y: expected {x.shape[0]} rows, got {list(grad_y.shape)}")
        return gemm(x, grad_y, trans_a=True), self.reduce_axis0(grad_y)

    # ----------------------------------------------------------------------- narrow heads
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
                (min(-(-rows // tile), MAX_BLOCKS),),
                (BLOCK,),
                (h, *_slots(Ws), *_slots(bs), *_slots(outs), *_widths(widths), len(Ws), rows,
                 np.int32(tile), np.int32(k_chunk)),
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
                (min(-(-rows // LINEAR_HEADS_TILE), MAX_BLOCKS), -(-H // BLOCK)),
                (BLOCK,),
                (*_slots(grad_ys), *_slots(Ws), *_widths(widths), w, np.int32(len(Ws)), grad_h,
                 rows),
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
            (h, *_slots(grad_ys), *_widths(widths), count, rows, np.int32(chunk_rows), partials),
            shared_mem=4 * chunk_rows * columns + table,
        )
        self._kernel("linear_heads.cu", "linear_heads_grad_reduce")(
            _blocks(partials[0].size),
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
        widths = widths if given else [g.shape[1] for g in checked]
        for j, (g, w) in enumerate(zip(checked, widths, strict=True)):
            if g.shape[0] != rows or g.shape[1] != w or w < 1:
                want = f"[{rows}, {w}]" if given else f"[{rows}, width >= 1]"
                raise ValueError(f"grad_ys[{j}]: expected shape {want}, got {list(g.shape)}")
        _columns("grad_ys", widths)
        return rows, checked, widths

    def _head_weights(self, weights: Sequence[float] | Array, count: int) -> Array:
        """The heads' λ as a float64 device array [count] (numbers are uploaded)."""
        if isinstance(weights, cupy.ndarray):
            return _array("weights", weights, (np.dtype(np.float64),), shape=(count,))
        values = list(weights)
        if len(values) != count:
            raise ValueError(f"weights: expected {count} numbers, got {len(values)}")
        return cupy.asarray([_number(f"weights[{i}]", v) for i, v in enumerate(values)])

    # ----------------------------------------------------------------------- encoder epilogue
    def bias_relu_fwd(self, z: Array, b: Array) -> Array:
        """h = max(z + b, 0) for z [rows, H], b [H] (encoder.cu)."""
        H = self.dims.H
        z = _array("z", z, ndim=2)
        if z.shape[1] != H:
            raise ValueError(f"z: expected shape [rows, {H}], got {list(z.shape)}")
        b = _array("b", b, shape=(H,))
        h = cupy.empty_like(z)
        if z.size:
            kernel = self._kernel("encoder.cu", "bias_relu_fwd")
            _aligned(H, z=z, b=b)
            kernel(_blocks(z.size // _vec(H)), (BLOCK,), (z, b, h, _int32("rows", z.shape[0])))
        return h

    def bias_relu_bwd(self, h: Array, grad_h: Array) -> Array:
        """grad_z = grad_h · 1[h > 0] for h, grad_h [rows, H] (encoder.cu)."""
        H = self.dims.H
        h = _array("h", h, ndim=2)
        if h.shape[1] != H:
            raise ValueError(f"h: expected shape [rows, {H}], got {list(h.shape)}")
        grad_h = _same("grad_h", grad_h, h)
        grad_z = cupy.empty_like(h)
        if h.size:
            kernel = self._kernel("encoder.cu", "bias_relu_bwd")
            _aligned(H, h=h, grad_h=grad_h)
            rows = _int32("rows", h.shape[0])
            kernel(_blocks(h.size // _vec(H)), (BLOCK,), (h, grad_h, grad_z, rows))
        return grad_z

    # ----------------------------------------------------------------------- reductions
    def reduce_axis0(self, x: Array) -> Array:
        """Σ over the leading axis, deterministic (reduce_axis0.cu): x [rows, ...] -> [...].

        Up to SINGLE_PASS_MAX_ROWS rows, one thread per column adds the rows in order (NumPy's
        order). Beyond, fixed chunks of CHUNK_ROWS rows are summed in order first, then the
        chunks in order; the split depends on the shape alone.
        """
        x = _array("x", x)
        if x.ndim < 1:
            raise ValueError("x: expected at least 1 dimension, got a 0-d array")
        rows = x.shape[0]
        cols = int(np.prod(x.shape[1:], dtype=np.int64))
        _int32("x.shape[0]", rows)
        _int32("columns of x", cols)
        out = cupy.empty(x.shape[1:], dtype=cupy.float32)
        if cols == 0:
            return out
        current = x.reshape(rows, cols)
        while rows > SINGLE_PASS_MAX_ROWS:
            chunks = -(-rows // CHUNK_ROWS)
            partials = cupy.empty((chunks, cols), dtype=cupy.float32)
            grid = (_blocks(cols)[0], min(chunks, 65535))
            self._kernel("reduce_axis0.cu", "reduce_axis0_partials")(
                grid,
                (BLOCK,),
                (current, partials, np.int32(rows), np.int32(cols), np.int32(CHUNK_ROWS)),
            )
            current, rows = partials, chunks
        self._kernel("reduce_axis0.cu", "reduce_axis0")(
            _blocks(cols), (BLOCK,), (current, out, np.int32(rows), np.int32(cols))
        )
        return out

    # ----------------------------------------------------------------------- encoder gradient
    def grad_h_stack(self, top: Array, bottom: Array, weight: Scalar) -> Array:
        """[top; λ bottom] for top [n, H], bottom [m, H] (grad_h_accumulate.cu): the stacked
        rows' encoder gradient in one pass."""
        top = _array("top", top, ndim=2)
        if top.shape[1] != self.dims.H:
            raise ValueError(f"top: expected shape [rows, {self.dims.H}], got {list(top.shape)}")
        bottom = _array("bottom", bottom, ndim=2)
        if bottom.shape[1] != self.dims.H:
            got = list(bottom.shape)
            raise ValueError(f"bottom: expected shape [rows, {self.dims.H}], got {got}")
        w = _scalar("weight", weight)
        rows = top.shape[0] + bottom.shape[0]
        _int32("rows of top and bottom", rows)
        out = cupy.empty((rows, self.dims.H), dtype=cupy.float32)
        if out.size:
            self._kernel("grad_h_accumulate.cu", "grad_h_stack")(
                _blocks(out.size),
                (BLOCK,),
                (top, bottom, w, np.int32(top.shape[0]), np.int32(bottom.shape[0]), out),
            )
        return out

    # ----------------------------------------------------------------------- non-finite guard
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

    # ----------------------------------------------------------------------- optimisation
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
        key = ("groups", tuple(counts), tuple(sizes))
        offsets = self._layouts.get(key)
        if offsets is None:  # uploaded once per layout, outside any capture (run eagerly first)
            if cupy.cuda.get_current_stream().is_capturing():
                raise RuntimeError("a new group layout while capturing: run eagerly first")
            bounds = np.cumsum([0, *sizes])
            per_group = [sum(counts[a:b]) for a, b in itertools.pairwise(bounds)]
            offsets = self._layouts[key] = cupy.asarray(np.cumsum([0, *per_group]))
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
        for group in _groups([g for g in checked if g.size]):  # one launch per 16 tensors
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
        norm = _array("norm", norm, (np.dtype(np.float64),), ndim=1)
        coef = cupy.empty(norm.shape, dtype=cupy.float64)
        self._kernel("grad_norm_clip.cu", "clip_coefficient")(
            (1,), (1,), (norm, _scalar("max_norm", max_norm), coef, np.int64(norm.size))
        )
        return coef

    def advance_counter(self, counter: Array, ok: Array) -> None:
        """counter += 1 in place when ok[0] (int64 [1], uint8 [1])."""
        counter = _counter("counter", counter)
        self._kernel("adamw_step.cu", "advance_counter")((1,), (1,), (counter, _flag("ok", ok)))

    def advance_counters(self, counters: Sequence[Array], ok: Array) -> None:
        """advance_counter for each counter, in one launch (up to 16 per launch)."""
        checked = [_counter(f"counters[{i}]", c) for i, c in enumerate(counters)]
        kernel = self._kernel("adamw_step.cu", "advance_counters")
        for group in _groups(checked):
            kernel((1,), (1,), (self._table(group), np.int32(len(group)), _flag("ok", ok)))

    def adamw_steps(
        self,
        params: Sequence[Array],
        grads: Sequence[Array],
        exp_avgs: Sequence[Array],
        exp_avg_sqs: Sequence[Array],
        steps: Sequence[Array],
        lr: Scalar,
        beta1: Scalar,
        beta2: Scalar,
        eps: Scalar,
        weight_decays: Sequence[Scalar],
        grad_scales: Sequence[Array],
        ok: Array,
    ) -> None:
        """adamw_step for each tensor i (its own step counter, weight decay and gradient scale),
        one launch per 16 tensors (adamw_step.cu's adamw_multi: the same arithmetic, so the same
        bits)."""
        tensors = []
        roles = (params, grads, exp_avgs, exp_avg_sqs, steps, weight_decays, grad_scales)
        if len({len(role) for role in roles}) != 1:
            raise ValueError(f"adamw_steps: expected sequences of one length, got {roles!r}")
        for i, (p, g, m, v, step, wd, scale) in enumerate(zip(*roles, strict=True)):
            p = _array(f"params[{i}]", p)
            tensors.append(
                (
                    p,
                    _same(f"grads[{i}]", g, p),
                    _same(f"exp_avgs[{i}]", m, p),
                    _same(f"exp_avg_sqs[{i}]", v, p),
                    _counter(f"steps[{i}]", step),
                    _scalar(f"weight_decays[{i}]", wd),
                    _one(f"grad_scales[{i}]", scale, (np.dtype(np.float64),)),
                )
            )
        scalars = (
            _scalar("lr", lr),
            _scalar("beta1", beta1),
            _scalar("beta2", beta2),
            _scalar("eps", eps),
            _flag("ok", ok),
        )
        # Gradients and clip coefficients are fresh every update, and numbers given as weight
        # decays are uploaded per call: their tables are written on the device, the others
        # reused.
        fresh = {1, 6} | (set() if all(isinstance(w, cupy.ndarray) for w in weight_decays) else {5})
        kernel = self._kernel("adamw_step.cu", "adamw_multi")
        for group in _groups([t for t in tensors if t[0].size]):
            layout = self._layout([t[0].size for t in group], MULTI_CHUNK)
            tables = [
                self._table([t[role] for t in group], persistent=role not in fresh)
                for role in range(7)
            ]
            kernel((layout.blocks,), (BLOCK,), (*tables, *layout.args, *scalars))

    # ----------------------------------------------------------------------- multi-tensor
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

    def _layout(self, sizes: Sequence[int], chunk: int) -> _Layout:
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
            layout = self._layouts[key] = _Layout(int(blocks[-1]), args)
        return layout

    def adamw_step(
        self,
        param: Array,
        grad: Array,
        exp_avg: Array,
        exp_avg_sq: Array,
        step: Array,
        lr: Scalar,
        beta1: Scalar,
        beta2: Scalar,
        eps: Scalar,
        weight_decay: Scalar,
        grad_scale: Array,
        ok: Array,
    ) -> None:
        """One AdamW update in place, nothing written unless ok[0] (adamw_step.cu).

        step: int64 [1], already advanced; grad_scale: float64 [1] (the clip coefficient).
        """
        param = _array("param", param)
        grad = _same("grad", grad, param)
        exp_avg = _same("exp_avg", exp_avg, param)
        exp_avg_sq = _same("exp_avg_sq", exp_avg_sq, param)
        args = (
            _counter("step", step),
            _scalar("lr", lr),
            _scalar("beta1", beta1),
            _scalar("beta2", beta2),
            _scalar("eps", eps),
            _scalar("weight_decay", weight_decay),
            _scalar("grad_scale", grad_scale),
            _flag("ok", ok),
        )
        if param.size:
            self._kernel("adamw_step.cu", "adamw_step")(
                _blocks(param.size),
                (BLOCK,),
                (param, grad, exp_avg, exp_avg_sq, *args, np.int64(param.size)),
            )

    def target_refresh(
        self,
        target: Sequence[Array],
        online: Sequence[Array],
        updates: Array,
        period: int,
        tau: Scalar,
        ok: Array,
    ) -> None:
        """Refresh each target tensor from its online twin in place (target_refresh.cu):
        Polyak with τ when tau > 0, else a copy when updates[0] % period == 0; only if ok[0]."""
        target, online = list(target), list(online)
        if len(target) != len(online):
            raise ValueError(f"online: expected {len(target)} arrays, got {len(online)}")
        pairs = []
        for i, (dst, src) in enumerate(zip(target, online, strict=True)):
            dst = _array(f"target[{i}]", dst)
            pairs.append((dst, _same(f"online[{i}]", src, dst)))
        args = (
            _counter("updates", updates),
            _int32("period", period, minimum=1),
            _scalar("tau", tau),
            _flag("ok", ok),
        )
        kernel = self._kernel("target_refresh.cu", "target_refresh_multi")
        for group in _groups([pair for pair in pairs if pair[0].size]):
            layout = self._layout([dst.size for dst, _ in group], MULTI_CHUNK)
            tables = (self._table([d for d, _ in group]), self._table([s for _, s in group]))
            kernel((layout.blocks,), (BLOCK,), (*tables, *layout.args, *args))

    # ----------------------------------------------------------------------- statistics
    def step_stats_accumulate(
        self, totals: Array, values: Sequence[Array | None], ok: Array, first: bool
    ) -> None:
        """One update's statistics into a Step's totals, in place, zeroed first by the Step's
        `first` update (step_stats.cu)."""
        totals = _array("totals", totals, (np.dtype(np.float64),), shape=(STEP_STATS + 7,))
        if len(values) != STEP_STATS:
            raise ValueError(f"values: expected {STEP_STATS} statistics, got {len(values)}")
        addresses = []
        for i, value in enumerate(values):
            dtypes = (np.dtype(np.float64),) if i == STEP_NORM else (np.dtype(np.float32),)
            addresses.append(
                np.uint64(0 if value is None else _one(f"values[{i}]", value, dtypes).data.ptr)
            )
        self._kernel("step_stats.cu", "step_stats_accumulate")(
            (1,), (1,), (totals, _flag("ok", ok), *addresses, np.int32(bool(first)))
        )

    # ----------------------------------------------------------------------- advantages
    def gae(
        self,
        rewards: Array,
        values: Array,
        next_values: Array,
        terminated: Array,
        truncated: Array,
        gamma: Scalar,
        lam: Scalar,
    ) -> tuple[Array, Array]:
        """(advantages, returns) [T, N] of a time-major rollout; one thread per env (gae.cu)."""
        values = _array("values", values, ndim=2)
        rewards = _same("rewards", rewards, values)
        next_values = _same("next_values", next_values, values)
        terminated = _array("terminated", terminated, _FLAG_DTYPES, shape=values.shape)
        truncated = _array("truncated", truncated, _FLAG_DTYPES, shape=values.shape)
        T, N = values.shape
        advantages = cupy.empty_like(values)
        returns = cupy.empty_like(values)
        if values.size:
            self._kernel("gae.cu", "gae")(
                _blocks(N),
                (BLOCK,),
                (
                    rewards,
                    values,
                    next_values,
                    terminated,
                    truncated,
                    _scalar("gamma", gamma),
                    _scalar("lam", lam),
                    advantages,
                    returns,
                    _int32("T", T),
                    _int32("N", N),
                ),
            )
        return advantages, returns


def _number(name: str, value: object) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{name}: expected a number, got {value!r}")
