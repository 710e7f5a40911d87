"""The C51 distributional Q head on CuPy: softmax, expected values, greedy selection and the
taken-action loss and gradients (kernels/dqn_distributional_q.cu), and the target's
projection onto the support (kernels/categorical_projection.cu).

Batch losses and statistics are means over per-row values reduced in a fixed order by one
block (no atomics), so the same inputs give the same bits on every run.
"""

from __future__ import annotations

import cupy
import numpy as np

from service.backend import numpy_ops
from service.backend.cuda.launch import (
    BLOCK,
    Array,
    KernelOps,
    Scalar,
    scalar_out,
    strided_blocks,
)
from service.backend.cuda.loader import CudaDims
from service.backend.cuda.validate import FLAG_DTYPES as _FLAGS
from service.backend.cuda.validate import I32 as _I32
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import batch as _batch
from service.backend.cuda.validate import count as _count
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["C51Ops", "c51_tile_rows"]

PROJ_THREADS = 256  # categorical_projection.cu: PROJ_THREADS
# dqn_distributional_q.cu's C51 taken-action kernels: sort and gradient block sizes, and the
# weight-gradient chunking (chunks of at least C51_CHUNK_ROWS rows, at most C51_MAX_CHUNKS).
C51_SORT_THREADS = 1024
C51_TAKEN_THREADS = 256
C51_GRAD_THREADS = 256
C51_I_TILE = 64  # features per c51_taken_grad_partials block (eight per warp)
C51_CHUNK_ROWS = 64
C51_MAX_CHUNKS = 64
C51_SHARED_FLOATS = 12288  # c51_taken_fwd_bwd's shared-memory budget per block (48 KB)
C51_BWD_I = 64  # features per staged chunk of the head's columns in c51_taken_fwd_bwd


def c51_tile_rows(H: int, Z: int) -> int:
    """C51_TILE_ROWS of c51_taken_fwd_bwd: rows per block (a multiple of 4, at most 16) that
    fit its shared memory beside the staged columns."""
    staged = C51_BWD_I * (Z | 1)
    row_floats = H + 2 * Z
    fit = (C51_SHARED_FLOATS - staged) // row_floats
    if fit < 4:
        raise ValueError(
            f"model.hidden_dim = {H}, c51.num_atoms = {Z}: 4 · ({H} + 2 · {Z}) + {staged} "
            f"floats, expected at most {C51_SHARED_FLOATS} (four replayed rows' features and "
            "atoms and a chunk of the head's columns must fit the C51 head kernel's shared "
            "memory)"
        )
    return min(16, fit) // 4 * 4


class C51Ops(KernelOps):
    """c51_support, c51_softmax, c51_q_values, c51_greedy, categorical_projection,
    c51_support_clip_ratio, c51_taken_loss_bwd and c51_taken_grad_params."""

    def __init__(self, dims: CudaDims) -> None:
        super().__init__(dims)
        self._tile_rows = c51_tile_rows(dims.H, dims.Z)  # a bad size fails here, not mid-Step

    def c51_support(self, v_min: float, v_max: float, num_atoms: int, dtype: np.dtype) -> Array:
        """z_i = v_min + i Δz on the device: the twin's values, computed on the host once."""
        return cupy.asarray(numpy_ops.c51_support(v_min, v_max, num_atoms, np.dtype(dtype)))

    def c51_softmax(self, logits: Array) -> Array:
        """p = softmax over atoms of logits [B, A, Z] (dqn_distributional_q.cu)."""
        A, Z = self.dims.A, self.dims.Z
        logits, B = _batch("logits", logits, (A, Z))
        probs = cupy.empty_like(logits)
        rows = _count("B·A", B * A)
        threads = _count("32·B·A", 32 * rows)  # one warp per row
        self._launch(
            "dqn_distributional_q.cu", "c51_softmax", threads, (logits, probs, np.int32(rows))
        )
        return probs

    def c51_q_values(self, probs: Array, support: Array) -> Array:
        """E[Z(s, a)] = Σ_i p_i z_i for probs [B, A, Z], support [Z] -> [B, A]."""
        A, Z = self.dims.A, self.dims.Z
        probs, B = _batch("probs", probs, (A, Z))
        support = _array("support", support, shape=(Z,))
        q = cupy.empty((B, A), dtype=cupy.float32)
        rows = _count("B·A", B * A)
        self._launch(
            "dqn_distributional_q.cu", "c51_q_values", rows, (probs, support, q, np.int32(rows))
        )
        return q

    def c51_greedy(self, logits: Array, bias: Array, support: Array) -> tuple[Array, Array]:
        """(a* [B] int32, p(s, a*) [B, Z]) from logits [B, A, Z] before the bias [A·Z]: one
        warp per row, the bias added as the logits are read, the [B, A, Z] probabilities never
        written (dqn_distributional_q.cu)."""
        A, Z = self.dims.A, self.dims.Z
        logits, B = _batch("logits", logits, (A, Z))
        bias = _array("bias", bias, shape=(A * Z,))
        support = _array("support", support, shape=(Z,))
        best = cupy.empty(B, dtype=cupy.int32)
        probs = cupy.empty((B, Z), dtype=cupy.float32)
        self._launch(
            "dqn_distributional_q.cu",
            "c51_greedy",
            _count("32·B", 32 * B),
            (logits, bias, support, best, probs, np.int32(B)),
        )
        return best, probs

    def _projection_args(
        self,
        next_probs: Array,
        rewards: Array,
        dones: Array,
        horizons: Array,
        gamma: Scalar,
        v_min: Scalar,
        v_max: Scalar,
    ) -> tuple[int, tuple]:
        next_probs, B = _batch("next_probs", next_probs, (self.dims.Z,))
        args = (
            next_probs,
            _array("rewards", rewards, shape=(B,)),
            _array("dones", dones, _FLAGS, shape=(B,)),
            _array("horizons", horizons, _I32, shape=(B,)),
            _scalar("gamma", gamma),
            _scalar("v_min", v_min),
            _scalar("v_max", v_max),
        )
        on_host = not isinstance(v_min, cupy.ndarray) and not isinstance(v_max, cupy.ndarray)
        if on_host and not float(v_min) < float(v_max):
            raise ValueError(f"v_max: expected a value above v_min = {v_min}, got {v_max}")
        return B, args

    def categorical_projection(
        self,
        next_probs: Array,
        rewards: Array,
        dones: Array,
        horizons: Array,
        gamma: Scalar,
        v_min: Scalar,
        v_max: Scalar,
    ) -> Array:
        """The C51 target m [B, Z]: Tz = r + γ^k (1 - done) z projected onto the support
        (categorical_projection.cu; dones uint8 [B], horizons int32 [B])."""
        B, args = self._projection_args(next_probs, rewards, dones, horizons, gamma, v_min, v_max)
        Z = self.dims.Z
        projected = cupy.empty((B, Z), dtype=cupy.float32)
        rows_per_block = max(1, PROJ_THREADS // Z)  # categorical_projection.cu: PROJ_ROWS
        self._kernel("categorical_projection.cu", "categorical_projection")(
            strided_blocks(B, rows_per_block), (PROJ_THREADS,), (*args, projected, np.int32(B))
        )
        return projected

    def c51_support_clip_ratio(
        self,
        next_probs: Array,
        rewards: Array,
        dones: Array,
        horizons: Array,
        gamma: Scalar,
        v_min: Scalar,
        v_max: Scalar,
    ) -> Array:
        """Mean over the batch of the target mass whose Tz falls outside [v_min, v_max] (0-d)."""
        B, args = self._projection_args(next_probs, rewards, dones, horizons, gamma, v_min, v_max)
        per_row = cupy.empty(B, dtype=cupy.float32)
        ratio = scalar_out()
        file = "categorical_projection.cu"
        self._launch(file, "c51_support_clip_ratio_rows", B, (*args, per_row, np.int32(B)))
        self._reduce(file, "c51_support_clip_ratio_mean", (per_row, ratio, np.int32(B)))
        return ratio

    def c51_taken_loss_bwd(
        self, h: Array, W: Array, b: Array, actions: Array, target: Array
    ) -> tuple[Array, Array, Array]:
        """(loss 0-d, grad_h [B, H], grad_taken [B, Z]) of the C51 head on replayed rows, each
        row's taken action only: rows sorted by action, then one block per tile of same-action
        rows for the logits, the cross-entropy, grad_taken and grad_h
        (dqn_distributional_q.cu). O(B·Z) work per feature instead of O(B·A·Z). An action
        outside [0, A) gives a NaN loss and zero gradient rows; no host check is made."""
        H, A, Z = self.dims.H, self.dims.A, self.dims.Z
        h, B = _batch("h", h, (H,))
        W = _array("W", W, shape=(H, A * Z))
        b = _array("b", b, shape=(A * Z,))
        actions = _array("actions", actions, _I32, shape=(B,))
        target = _array("target", target, shape=(B, Z))
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad_taken = cupy.empty((B, Z), dtype=cupy.float32)
        grad_h = cupy.empty((B, H), dtype=cupy.float32)
        loss = scalar_out()
        order, offsets = self._sort_actions(actions)
        self._kernel("dqn_distributional_q.cu", "c51_taken_fwd_bwd")(
            (-(-B // self._tile_rows) + A + 1,),
            (C51_TAKEN_THREADS,),
            (h, W, b, target, order, offsets, per_row, grad_taken, grad_h, np.int32(B)),
        )
        self._reduce("dqn_distributional_q.cu", "c51_loss_mean", (per_row, loss, np.int32(B)))
        return loss, grad_h, grad_taken

    def c51_taken_grad_params(
        self, h: Array, actions: Array, grad_taken: Array, num_actions: int
    ) -> tuple[Array, Array]:
        """(grad_W [H, A·Z], grad_b [A·Z]) from `c51_taken_loss_bwd`'s grad_taken: rows sorted
        by action, per-chunk partials of each action's columns, each action's chunks summed in
        chunk order (dqn_distributional_q.cu); scratch at most 64 · (H + 1) · A·Z floats (about
        (B / chunk_rows + A) · (H + 1) · Z of it written). Rows whose action is outside [0, A)
        are not read."""
        H, A, Z = self.dims.H, self.dims.A, self.dims.Z
        if num_actions != A:
            raise ValueError(f"num_actions: expected {A} (the compiled A), got {num_actions}")
        h, B = _batch("h", h, (H,))
        actions = _array("actions", actions, _I32, shape=(B,))
        grad_taken = _array("grad_taken", grad_taken, shape=(B, Z))
        chunk_rows = max(C51_CHUNK_ROWS, -(-B // C51_MAX_CHUNKS))
        chunks = -(-B // chunk_rows)
        partial_W = cupy.empty((chunks, H, A * Z), dtype=cupy.float32)
        partial_b = cupy.empty((chunks, A * Z), dtype=cupy.float32)
        order, offsets = self._sort_actions(actions)
        file = "dqn_distributional_q.cu"
        self._kernel(file, "c51_taken_grad_partials")(
            (chunks + A + 1, -(-H // C51_I_TILE)),
            (C51_GRAD_THREADS,),
            (h, grad_taken, order, offsets, partial_W, partial_b, np.int32(chunk_rows)),
        )
        grad_W = cupy.empty((H, A * Z), dtype=cupy.float32)
        grad_b = cupy.empty(A * Z, dtype=cupy.float32)
        self._kernel(file, "c51_taken_grad_reduce")(
            strided_blocks((H + 1) * A * Z),
            (BLOCK,),
            (partial_W, partial_b, offsets, np.int32(chunk_rows), grad_W, grad_b),
        )
        return grad_W, grad_b

    def _sort_actions(self, actions: Array) -> tuple[Array, Array]:
        """(order [B]: row indices stably sorted by action, rows of invalid actions last;
        offsets [A + 2]: each action's segment of `order`), by chunks of C51_SORT_THREADS rows
        counted, then placed (dqn_distributional_q.cu)."""
        B = actions.shape[0]
        chunks = max(1, -(-B // C51_SORT_THREADS))
        counts = cupy.empty((chunks, self.dims.A + 1), dtype=cupy.int32)
        order = cupy.empty(B, dtype=cupy.int32)
        offsets = cupy.empty(self.dims.A + 2, dtype=cupy.int32)
        file = "dqn_distributional_q.cu"
        self._kernel(file, "c51_sort_counts")(
            (chunks,), (C51_SORT_THREADS,), (actions, counts, np.int32(B))
        )
        self._kernel(file, "c51_sort_place")(
            (chunks,), (C51_SORT_THREADS,), (actions, counts, order, offsets, np.int32(B))
        )
        return order, offsets
