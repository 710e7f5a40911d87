"""The PPO policy head on CuPy (kernels/ppo_clipped_surrogate.cu): log-softmax, the clipped
surrogate with its entropy bonus and statistics, and advantage normalisation. Batch means are
reduced in a fixed order by one block (no atomics)."""

from __future__ import annotations

import cupy
import numpy as np

from service.backend.cuda.launch import Array, KernelOps, Scalar
from service.backend.cuda.validate import I32 as _I32
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import batch as _batch
from service.backend.cuda.validate import count as _count
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["PpoOps"]

PPO_ROW_STATS = 5  # ppo_clipped_surrogate.cu: PPO_ROW_STATS columns of row_stats
PPO_STATS = ("loss", "pg_loss", "entropy", "approx_kl", "clip_fraction")  # the twin's dict order


class PpoOps(KernelOps):
    """log_softmax, ppo_surrogate_fwd_bwd, normalize_advantages and kickstart_fwd_bwd."""

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

    def kickstart_fwd_bwd(
        self, logits: Array, feature: Array, actions: tuple[int, int, int], weight: Scalar
    ) -> tuple[Array, Array]:
        """Kickstarting's cross-entropy with a sign-of-a-feature teacher for logits [B, A]
        (numpy_ops.kickstart_fwd_bwd's formula): log_softmax's kernel, then CuPy's elementwise
        ops and one reduction over the rows (a fixed order, no atomics). Returns (loss: a 0-d
        device array, grad_logits [B, A])."""
        logits, B = _batch("logits", logits, (self.dims.A,))
        feature = _array("feature", cupy.ascontiguousarray(feature), shape=(B,))
        weight = _scalar("weight", weight)
        below, zero, above = (int(a) for a in actions)
        teacher = cupy.where(feature > 0, above, cupy.where(feature < 0, below, zero))
        taught = (teacher >= 0)[:, None]  # -1: the teacher says nothing on the row
        onehot = cupy.arange(self.dims.A)[None, :] == teacher[:, None]
        log_p = self.log_softmax(logits)
        w = weight.astype(logits.dtype)
        loss = -(w[0] * cupy.mean(cupy.sum(cupy.where(onehot, log_p, 0), axis=-1)))
        grad = cupy.where(taught, (w / B) * (cupy.exp(log_p) - onehot), 0)
        return loss, grad.astype(logits.dtype, copy=False)
