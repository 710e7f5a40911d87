"""The head ops on CuPy: C51, target projection, PPO, value, perception heads, Act, replay.

`HeadOps(dims)` has one method per head op of `service/backend/numpy_ops.py`, with the twin's
name and parameter names in the twin's order, so an instance passes `check_op_set` for these
ops (the others come from `core_ops.CoreOps`); plus `act_select` and `replay_*`, which have no
single twin (Trainer.act's action choice; ReplayBuffer's insert and sample). Kernels are
`kernels/{dqn_distributional_q,categorical_projection,ppo_clipped_surrogate,v_head_fwd_bwd,
perception_heads,act,replay}.cu`, compiled for `dims` on first use.

Every method checks dtype, shape and C-contiguity before launching (CuPy checks nothing) and
raises ValueError naming the argument; sizes go to kernels as np.int32 / np.int64, never as
Python ints. Results are CuPy arrays; a scalar result (a loss, a statistic) is a 0-d float32
device array — nothing is read back to the host, so an op never waits for a GPU result.

Hyper-parameters (γ, v_min, v_max, PPO's ε and c_ent, the value clip ε, Act's ε) reach the
kernels as float64 device scalars, as in core_ops: each accepts a Python number, uploaded per
call (the twin's interface), or a float64 cupy array of one element (a slice of the device
hyper-parameter vector) — the form to use inside a captured CUDA graph, where nothing may be
uploaded. Likewise the Philox key (uint32 [2], (seed low, seed high)) and the Philox sequence
(int64 [1], a counter) of `act_select` and the replay sampler.

Batch losses and statistics are means over per-row values reduced in a fixed order by one
block (no atomics), so the same inputs give the same bits on every run.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import cupy
import numpy as np

from service.backend import numpy_ops
from service.backend.cuda.core_ops import CoreOps
from service.backend.cuda.loader import CudaDims, load_kernel
from service.backend.cuda.validate import F32 as _F32
from service.backend.cuda.validate import FLAG_DTYPES as _FLAGS
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import one as _one
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["ACT_MODES", "REPLAY_FIELDS", "CudaDims", "HeadOps"]

Array = cupy.ndarray
Scalar = float | cupy.ndarray

BLOCK = 256  # threads per block of the row / element kernels
REDUCE_THREADS = 256  # the *_REDUCE_THREADS block size of the single-block mean kernels
PROJ_THREADS = 256  # categorical_projection.cu: PROJ_THREADS
GATHER_MAX = 8  # replay.cu: GATHER_MAX arrays per gather_rows launch
# dqn_distributional_q.cu's C51 taken-action kernels: sort and gradient block sizes, and the
# weight-gradient chunking (chunks of at least C51_CHUNK_ROWS rows, at most C51_MAX_CHUNKS).
C51_SORT_THREADS = 256
C51_TAKEN_THREADS = 256
C51_GRAD_THREADS = 256
C51_I_TILE = 32  # features per c51_taken_grad_partials block (four per warp)
C51_CHUNK_ROWS = 64
C51_MAX_CHUNKS = 64
C51_SHARED_FLOATS = 10240  # c51_taken_fwd_bwd's shared-memory budget per block


def c51_tile_rows(H: int, Z: int) -> int:
    """C51_TILE_ROWS of c51_taken_fwd_bwd: rows per block that fit its shared memory."""
    z_lanes = min(256, -(-Z // 32) * 32)
    row_floats = H + (C51_TAKEN_THREADS // z_lanes + 1) * Z
    if row_floats > C51_SHARED_FLOATS:
        raise ValueError(
            f"model.hidden_dim + {C51_TAKEN_THREADS // z_lanes + 1} · c51.num_atoms = "
            f"{row_floats}: expected at most {C51_SHARED_FLOATS} (one replayed row's features "
            "and atoms must fit the C51 head kernel's shared memory)"
        )
    return min(16, C51_SHARED_FLOATS // row_floats)
PPO_ROW_STATS = 5  # ppo_clipped_surrogate.cu: PPO_ROW_STATS columns of row_stats
PPO_STATS = ("loss", "pg_loss", "entropy", "approx_kl", "clip_fraction")  # the twin's dict order

# act.cu's ACT_MODE_*; keys are Trainer's ActMode values (an ActMode itself is accepted too).
ACT_MODES = {"sample": 0, "greedy_pi": 1, "greedy_q": 2, "epsilon_greedy": 3}

# ReplayBuffer's storage fields, in replay.cu's argument order.
REPLAY_FIELDS = ("obs", "actions", "rewards", "dones", "horizons", "next_obs")

_I32 = (np.dtype(np.int32),)
_INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- validation
# _array, _one, _scalar, _F32 and _FLAGS are service/backend/cuda/validate.py's, shared with
# core_ops.
def _batch(name: str, a: object, trailing: tuple[int, ...], dtypes: Sequence[np.dtype] = _F32):
    """`a` of shape [B, *trailing] with 1 <= B < 2^31; returns (array, B)."""
    if isinstance(a, cupy.ndarray) and a.ndim == 1 + len(trailing) and a.shape[1:] == trailing:
        rows = a.shape[0]
        if not 1 <= rows <= _INT32_MAX:
            raise ValueError(f"{name}: expected 1 to 2**31 - 1 rows, got {rows}")
        return _array(name, a, dtypes), rows
    labels = ", ".join(["B", *(str(n) for n in trailing)])
    got = list(a.shape) if isinstance(a, cupy.ndarray) else type(a).__name__
    raise ValueError(f"{name}: expected a cupy.ndarray of shape [{labels}], got {got}")


def _key(name: str, key: object) -> Array:
    """The Philox key as uint32 [2] in device memory: as is, or a (low, high) pair uploaded."""
    if isinstance(key, cupy.ndarray):
        return _array(name, key, (np.dtype(np.uint32),), shape=(2,))
    if (
        isinstance(key, tuple | list)
        and len(key) == 2
        and all(isinstance(w, numbers.Integral) and 0 <= int(w) < 2**32 for w in key)
    ):
        return cupy.asarray(np.array([int(w) for w in key], dtype=np.uint32))
    raise ValueError(
        f"{name}: expected a (low, high) pair of uint32 words or a uint32 cupy array [2], "
        f"got {key!r}"
    )


def _sequence(name: str, value: object) -> Array:
    """A Philox sequence as int64 [1] in device memory: a counter as is, an int uploaded."""
    if isinstance(value, cupy.ndarray):
        return _one(name, value, (np.dtype(np.int64),))
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < 2**63:
        return cupy.asarray(np.array([int(value)], dtype=np.int64))
    raise ValueError(
        f"{name}: expected an int in [0, 2**63) or an int64 cupy array [1], got {value!r}"
    )


def _sequence_value(name: str, value: object) -> int:
    """A Philox sequence number given on the host, as an int in [0, 2**63)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < 2**63:
        return int(value)
    raise ValueError(f"{name}: expected an int in [0, 2**63), got {value!r}")


def _count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if not minimum <= int(value) <= _INT32_MAX:
        raise ValueError(f"{name}: expected an int in [{minimum}, 2**31), got {value}")
    return int(value)


def _blocks(n: int) -> tuple[int]:
    return (-(-n // BLOCK),)


def _scalar_out() -> Array:
    """A 0-d float32 device array for a batch loss or statistic."""
    return cupy.empty((), dtype=cupy.float32)


class HeadOps:
    """The head op set, with kernels compiled for `dims` (loaded on first use, then cached)."""

    def __init__(self, dims: CudaDims) -> None:
        self.dims = dims
        self.__name__ = f"{type(self).__module__}.HeadOps"  # check_op_set's messages use it
        self._defines = dims.defines()
        self._unused: Array | None = None
        self._core = CoreOps(dims)  # reduce_axis0 for the C51 head's gradients
        self._tile_rows = c51_tile_rows(dims.H, dims.Z)

    def _unused_scalar(self) -> Array:
        """A float64 [1] device array for a scalar argument the kernel will not read."""
        if self._unused is None:
            self._unused = cupy.zeros(1, dtype=cupy.float64)
        return self._unused

    def _launch(self, file: str, name: str, threads: int, args: tuple) -> None:
        """`threads` threads of `name` in BLOCK-sized blocks (nothing when threads = 0)."""
        if threads > 0:
            load_kernel(file, name, self._defines)(_blocks(threads), (BLOCK,), args)

    def _reduce(self, file: str, name: str, args: tuple) -> None:
        """A single-block fixed-order reduction kernel (REDUCE_THREADS threads)."""
        load_kernel(file, name, self._defines)((1,), (REDUCE_THREADS,), args)

    # ----------------------------------------------------------------------- C51 head
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
        if B:
            rows_per_block = max(1, PROJ_THREADS // Z)  # categorical_projection.cu: PROJ_ROWS
            load_kernel("categorical_projection.cu", "categorical_projection", self._defines)(
                (-(-B // rows_per_block),), (PROJ_THREADS,), (*args, projected, np.int32(B))
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
        ratio = _scalar_out()
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
        loss = _scalar_out()
        if B:
            order, offsets = self._sort_actions(actions)
            load_kernel("dqn_distributional_q.cu", "c51_taken_fwd_bwd", self._defines)(
                (-(-B // self._tile_rows), A + 1),
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
        chunks = max(1, -(-B // chunk_rows))
        partial_W = cupy.empty((chunks, H, A * Z), dtype=cupy.float32)
        partial_b = cupy.empty((chunks, A * Z), dtype=cupy.float32)
        if B:
            order, offsets = self._sort_actions(actions)
        else:
            order, offsets = cupy.empty(0, dtype=cupy.int32), cupy.zeros(A + 2, dtype=cupy.int32)
        file, defines = "dqn_distributional_q.cu", self._defines
        load_kernel(file, "c51_taken_grad_partials", defines)(
            (chunks, A, -(-H // C51_I_TILE)),
            (C51_GRAD_THREADS,),
            (h, grad_taken, order, offsets, partial_W, partial_b, np.int32(chunk_rows)),
        )
        grad_W = cupy.empty((H, A * Z), dtype=cupy.float32)
        grad_b = cupy.empty(A * Z, dtype=cupy.float32)
        load_kernel(file, "c51_taken_grad_reduce", defines)(
            _blocks((H + 1) * A * Z),
            (BLOCK,),
            (partial_W, partial_b, offsets, np.int32(chunk_rows), grad_W, grad_b),
        )
        return grad_W, grad_b

    def _sort_actions(self, actions: Array) -> tuple[Array, Array]:
        """(order [B]: row indices stably sorted by action, rows of invalid actions last;
        offsets [A + 2]: each action's segment of `order`) for B >= 1 rows."""
        order = cupy.empty(actions.shape[0], dtype=cupy.int32)
        offsets = cupy.empty(self.dims.A + 2, dtype=cupy.int32)
        load_kernel("dqn_distributional_q.cu", "c51_sort_actions", self._defines)(
            (self.dims.A + 1,),
            (C51_SORT_THREADS,),
            (actions, order, offsets, np.int32(actions.shape[0])),
        )
        return order, offsets

    # ----------------------------------------------------------------------- PPO policy head
    def log_softmax(self, logits: Array) -> Array:
        """log softmax over the last axis (A) of logits [..., A]."""
        A = self.dims.A
        logits = _array("logits", logits)
        if logits.ndim < 1 or logits.shape[-1] != A or logits.size == 0:
            got = list(logits.shape)
            raise ValueError(f"logits: expected a non-empty shape [..., {A}], got {got}")
        rows = _count("rows of logits", logits.size // A)
        out = cupy.empty_like(logits)
        self._launch(
            "ppo_clipped_surrogate.cu", "ppo_log_softmax", rows, (logits, out, np.int32(rows))
        )
        return out

    def ppo_surrogate_fwd_bwd(
        self,
        logits: Array,
        actions: Array,
        behavior_log_probs: Array,
        advantages: Array,
        clip_eps: Scalar,
        ent_coef: Scalar,
    ) -> tuple[dict[str, Array], Array]:
        """PPO clipped surrogate with entropy bonus for policy logits [B, A].

        Returns ({loss, pg_loss, entropy, approx_kl, clip_fraction}: 0-d device arrays,
        grad_logits [B, A]). An action outside [0, A) makes the statistics NaN.
        """
        logits, B = _batch("logits", logits, (self.dims.A,))
        actions = _array("actions", actions, _I32, shape=(B,))
        behavior_log_probs = _array("behavior_log_probs", behavior_log_probs, shape=(B,))
        advantages = _array("advantages", advantages, shape=(B,))
        clip_eps = _scalar("clip_eps", clip_eps)
        ent_coef = _scalar("ent_coef", ent_coef)
        grad = cupy.empty_like(logits)
        row_stats = cupy.empty((B, PPO_ROW_STATS), dtype=cupy.float32)
        stats = cupy.empty(len(PPO_STATS), dtype=cupy.float32)
        file = "ppo_clipped_surrogate.cu"
        self._launch(
            file,
            "ppo_surrogate_fwd_bwd",
            B,
            (
                logits,
                actions,
                behavior_log_probs,
                advantages,
                clip_eps,
                ent_coef,
                grad,
                row_stats,
                np.int32(B),
            ),
        )
        self._reduce(file, "ppo_stats_mean", (row_stats, ent_coef, stats, np.int32(B)))
        return {name: stats[i] for i, name in enumerate(PPO_STATS)}, grad

    def normalize_advantages(self, advantages: Array) -> Array:
        """(Â - mean) / (std + 1e-8) over advantages [B], population std."""
        advantages, B = _batch("advantages", advantages, ())
        stats = cupy.empty(2, dtype=cupy.float32)  # mean, std + 1e-8
        out = cupy.empty_like(advantages)
        file = "ppo_clipped_surrogate.cu"
        self._reduce(file, "normalize_advantages_stats", (advantages, stats, np.int32(B)))
        self._launch(file, "normalize_advantages_apply", B, (advantages, stats, out, np.int32(B)))
        return out

    # ----------------------------------------------------------------------- value head
    def value_fwd_bwd(
        self, values: Array, returns: Array, old_values: Array, clip_eps: Scalar | None
    ) -> tuple[Array, Array]:
        """(loss 0-d, grad_values [B]) of mean 0.5 (v - R)², PPO-clipped when clip_eps is
        not None (a number or a float64 device scalar)."""
        values, B = _batch("values", values, ())
        returns = _array("returns", returns, shape=(B,))
        old_values = _array("old_values", old_values, shape=(B,))
        use_clip = clip_eps is not None
        # Unclipped, the kernel never reads clip_eps; any valid float64 pointer will do (one
        # made once, so an unclipped call uploads nothing, as a captured graph requires).
        eps = _scalar("clip_eps", clip_eps) if use_clip else self._unused_scalar()
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad = cupy.empty_like(values)
        loss = _scalar_out()
        file = "v_head_fwd_bwd.cu"
        self._launch(
            file,
            "value_fwd_bwd",
            B,
            (values, returns, old_values, eps, np.int32(use_clip), per_row, grad, np.int32(B)),
        )
        self._reduce(file, "value_loss_mean", (per_row, loss, np.int32(B)))
        return loss, grad

    # ----------------------------------------------------------------------- perception heads
    def bce_fwd_bwd(self, u: Array, y: Array) -> tuple[Array, Array]:
        """(loss 0-d, grad_u [B]) of mean softplus(u) - y u for logits u, labels y [B] float32."""
        u, B = _batch("u", u, ())
        y = _array("y", y, shape=(B,))
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad = cupy.empty_like(u)
        loss = _scalar_out()
        file = "perception_heads.cu"
        self._launch(file, "bce_fwd_bwd", B, (u, y, per_row, grad, np.int32(B)))
        self._reduce(file, "perception_loss_mean", (per_row, loss, np.int32(B), np.int64(B)))
        return loss, grad

    def aux_mse_fwd_bwd(self, pred: Array, target: Array) -> tuple[Array, Array]:
        """(loss 0-d, grad_pred [B, K]) of mean (p - t)² over all B·K entries."""
        K = self.dims.K
        if K < 1:
            raise ValueError("pred: the aux head does not exist (compiled with K = 0)")
        pred, B = _batch("pred", pred, (K,))
        target = _array("target", target, shape=(B, K))
        per_row = cupy.empty(B, dtype=cupy.float32)
        grad = cupy.empty_like(pred)
        loss = _scalar_out()
        file = "perception_heads.cu"
        self._launch(file, "aux_mse_fwd_bwd", B, (pred, target, per_row, grad, np.int32(B)))
        self._reduce(file, "perception_loss_mean", (per_row, loss, np.int32(B), np.int64(B * K)))
        return loss, grad

    # ----------------------------------------------------------------------- acting
    def sample_categorical(self, logits: Array, uniforms: Array) -> Array:
        """Inverse-CDF sample per row of logits [N, A] with uniforms [N] in [0, 1) -> int32 [N]."""
        logits, N = _batch("logits", logits, (self.dims.A,))
        uniforms = _array("uniforms", uniforms, shape=(N,))
        actions = cupy.empty(N, dtype=cupy.int32)
        self._launch("act.cu", "sample_categorical", N, (logits, uniforms, actions, np.int32(N)))
        return actions

    def act_select(
        self,
        logits: Array,
        q_values: Array | None,
        mode: object,
        epsilon: Scalar,
        key: object,
        sequence: object,
    ) -> tuple[Array, Array]:
        """Trainer.act's action choice on the device: (actions int32 [N], log_probs [N]).

        logits [N, A] (policy head); q_values [N, A] (E[Z(s, a)]; needed by the Q modes, else
        may be None); mode: an ActMode or its value ('sample', 'greedy_pi', 'greedy_q',
        'epsilon_greedy'); epsilon: ε for 'epsilon_greedy' (number or float64 device scalar);
        key: the Philox key, (low, high) words or uint32 [2]; sequence: this call's act_calls
        counter value, an int or int64 [1] (the caller advances the counter). log_probs is
        log π(a|s) of the returned action, as ActResult.log_probs.
        """
        A = self.dims.A
        name = getattr(mode, "value", mode)
        if not isinstance(name, str) or name not in ACT_MODES:
            raise ValueError(f"mode: expected one of {sorted(ACT_MODES)}, got {mode!r}")
        logits, N = _batch("logits", logits, (A,))
        if q_values is None:
            if name in ("greedy_q", "epsilon_greedy"):
                raise ValueError(f"q_values: required by mode {name!r}, got None")
            q_values = logits  # never read by the policy modes; any valid pointer will do
        q_values = _array("q_values", q_values, shape=(N, A))
        if isinstance(epsilon, numbers.Real) and not 0.0 <= float(epsilon) <= 1.0:
            raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon!r}")
        args = (
            logits,
            q_values,
            np.int32(ACT_MODES[name]),
            _scalar("epsilon", epsilon),
            _key("key", key),
            _sequence("sequence", sequence),
        )
        actions = cupy.empty(N, dtype=cupy.int32)
        log_probs = cupy.empty(N, dtype=cupy.float32)
        self._launch("act.cu", "act_select", N, (*args, actions, log_probs, np.int32(N)))
        return actions, log_probs

    # ----------------------------------------------------------------------- replay
    def _replay_storage(self, storage: Mapping[str, Array]) -> tuple[int, tuple[Array, ...]]:
        """The ring's arrays in REPLAY_FIELDS order, checked; returns (capacity, arrays)."""
        D = self.dims.D
        missing = [name for name in REPLAY_FIELDS if name not in storage]
        if missing:
            raise ValueError(f"storage: expected fields {list(REPLAY_FIELDS)}, missing {missing}")
        obs, capacity = _batch("storage['obs']", storage["obs"], (D,))
        arrays = (
            obs,
            _array("storage['actions']", storage["actions"], _I32, shape=(capacity,)),
            _array("storage['rewards']", storage["rewards"], shape=(capacity,)),
            _array("storage['dones']", storage["dones"], _FLAGS, shape=(capacity,)),
            _array("storage['horizons']", storage["horizons"], _I32, shape=(capacity,)),
            _array("storage['next_obs']", storage["next_obs"], shape=(capacity, D)),
        )
        return capacity, arrays

    def replay_insert(
        self,
        storage: Mapping[str, Array],
        position: Array,
        size: Array,
        obs: Array,
        actions: Array,
        rewards: Array,
        dones: Array,
        horizons: Array,
        next_obs: Array,
    ) -> None:
        """ReplayBuffer.insert on the device: write the batch in order at the ring position,
        wrapping around (only the newest `capacity` rows of a larger batch), then advance
        position and size (int64 [1] each, in place)."""
        capacity, ring = self._replay_storage(storage)
        position = _one("position", position, (np.dtype(np.int64),))
        size = _one("size", size, (np.dtype(np.int64),))
        obs, count = _batch("obs", obs, (self.dims.D,))
        batch = (
            obs,
            _array("actions", actions, _I32, shape=(count,)),
            _array("rewards", rewards, shape=(count,)),
            _array("dones", dones, (ring[3].dtype,), shape=(count,)),
            _array("horizons", horizons, _I32, shape=(count,)),
            _array("next_obs", next_obs, shape=(count, self.dims.D)),
        )
        kept = min(count, capacity)
        skip = count - kept
        file = "replay.cu"
        self._launch(
            file,
            "replay_insert",
            _count("kept·D", kept * self.dims.D),
            (*batch, np.int64(skip), np.int64(kept), *ring, position, np.int64(capacity)),
        )
        load_kernel(file, "replay_advance", self._defines)(
            (1,), (1,), (position, size, np.int64(kept), np.int64(capacity))
        )

    def replay_sample_indices(
        self, size: Array, key: object, sequence: object, count: int
    ) -> Array:
        """`count` slots drawn uniformly with replacement, slot_i = ⌊word0 · size / 2³²⌋ of the
        Philox counter (i, sequence, REPLAY, ·), as ReplayBuffer.sample -> int32 [count]."""
        size = _one("size", size, (np.dtype(np.int64),))
        count = _count("count", count)
        slots = cupy.empty(count, dtype=cupy.int32)
        self._launch(
            "replay.cu",
            "replay_sample_indices",
            count,
            (size, _key("key", key), _sequence("sequence", sequence), slots, np.int32(count)),
        )
        return slots

    def minibatch_order(self, key: object, sequence: int, rows: int) -> Array:
        """A seeded permutation of 0 .. rows-1 (int32 [rows]) as numpy_ops.minibatch_order:
        minibatch.cu's unique 64-bit keys, sorted on the device."""
        rows = _count("rows", rows)
        sequence = int(_sequence_value("sequence", sequence))
        keys = cupy.empty(rows, dtype=cupy.uint64)
        self._launch(
            "minibatch.cu",
            "minibatch_keys",
            rows,
            (_key("key", key), np.uint32(sequence & 0xFFFFFFFF), np.uint32(sequence >> 32),
             np.int32(rows), keys),
        )  # fmt: skip
        return cupy.argsort(keys).astype(cupy.int32)

    def replay_gather(self, storage: Mapping[str, Array], slots: Array) -> dict[str, Array]:
        """The ring's rows at `slots` (int32 [count], each in [0, size)), one array per field."""
        _, ring = self._replay_storage(storage)
        slots, count = _batch("slots", slots, (), _I32)
        out = {
            name: cupy.empty((count, *array.shape[1:]), dtype=array.dtype)
            for name, array in zip(REPLAY_FIELDS, ring, strict=True)
        }
        self._launch(
            "replay.cu",
            "replay_gather",
            _count("count·D", count * self.dims.D),
            (slots, *ring, *(out[name] for name in REPLAY_FIELDS), np.int32(count)),
        )
        return out

    def gather_rows(self, arrays: Sequence[Array], rows: Array) -> list[Array]:
        """[a[rows] for each array] in one launch (replay.cu): up to GATHER_MAX C-contiguous
        arrays [B_j, ...] of 4-byte elements (float32, int32); rows int32 [n], each in every
        array's [0, B_j) — not checked on the device (the trainer passes its permutation)."""
        arrays = list(arrays)
        if not 1 <= len(arrays) <= GATHER_MAX:
            raise ValueError(f"arrays: expected 1 to {GATHER_MAX} arrays, got {len(arrays)}")
        rows, n = _batch("rows", rows, (), _I32)
        checked = []
        for j, a in enumerate(arrays):
            a = _array(f"arrays[{j}]", a, (np.dtype(np.float32), np.dtype(np.int32)))
            if a.ndim < 1:
                raise ValueError(f"arrays[{j}]: expected at least 1 dimension, got a 0-d array")
            checked.append(a)
        out = [cupy.empty((n, *a.shape[1:]), dtype=a.dtype) for a in checked]
        widths = [int(np.prod(a.shape[1:], dtype=np.int64)) for a in checked]
        pad = GATHER_MAX - len(checked)
        if n and any(widths):
            self._launch(
                "replay.cu",
                "gather_rows",
                _count("rows·width", n * max(widths)),
                (*checked, *[checked[0]] * pad, *out, *[out[0]] * pad,
                 *[np.int32(w) for w in widths], *[np.int32(0)] * pad,
                 np.int32(len(checked)), rows, np.int32(n)),
            )  # fmt: skip
        return out

    def replay_sample(
        self, storage: Mapping[str, Array], size: Array, key: object, sequence: object, count: int
    ) -> dict[str, Array]:
        """ReplayBuffer.sample on the device: `count` transitions, one array per field."""
        return self.replay_gather(storage, self.replay_sample_indices(size, key, sequence, count))
