"""Generalised advantage estimation on CuPy (kernels/gae.cu): one thread per env runs the
backward recursion over the rollout's T steps."""

from __future__ import annotations

import cupy

from service.backend.cuda.launch import BLOCK, Array, KernelOps, Scalar, strided_blocks
from service.backend.cuda.validate import FLAG_DTYPES as _FLAGS
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import int32 as _int32
from service.backend.cuda.validate import same as _same
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["GaeOps"]


class GaeOps(KernelOps):
    """gae."""

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
        terminated = _array("terminated", terminated, _FLAGS, shape=values.shape)
        truncated = _array("truncated", truncated, _FLAGS, shape=values.shape)
        T, N = values.shape
        advantages = cupy.empty_like(values)
        returns = cupy.empty_like(values)
        if values.size:
            self._kernel("gae.cu", "gae")(
                strided_blocks(N),
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
