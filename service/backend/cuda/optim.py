"""The in-place parameter updates on CuPy: AdamW and its step counters (kernels/adamw_step.cu)
and the target network's refresh (kernels/target_refresh.cu). Each writes nothing unless the
non-finite guard's ok[0] is set: the guard reaches them as data, as a captured graph needs."""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from service.backend.cuda.launch import BLOCK, Array, Scalar, strided_blocks
from service.backend.cuda.tensor_table import TensorTableOps, groups
from service.backend.cuda.validate import F64 as _F64
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import counter as _counter
from service.backend.cuda.validate import flag as _flag
from service.backend.cuda.validate import int32 as _int32
from service.backend.cuda.validate import one as _one
from service.backend.cuda.validate import same as _same
from service.backend.cuda.validate import scalar as _scalar

__all__ = ["OptimOps"]

MULTI_CHUNK = 4 * BLOCK  # elements per block of adamw_multi and target_refresh_multi


class OptimOps(TensorTableOps):
    """advance_counter(s), adamw_step(s) and target_refresh."""

    def advance_counter(self, counter: Array, ok: Array) -> None:
        """counter += 1 in place when ok[0] (int64 [1], uint8 [1])."""
        counter = _counter("counter", counter)
        self._kernel("adamw_step.cu", "advance_counter")((1,), (1,), (counter, _flag("ok", ok)))

    def advance_counters(self, counters: Sequence[Array], ok: Array) -> None:
        """advance_counter for each of distinct counters, in one launch (up to 16 per launch),
        one thread per counter."""
        checked = [_counter(f"counters[{i}]", c) for i, c in enumerate(counters)]
        if len({c.data.ptr for c in checked}) != len(checked):
            raise ValueError("counters: expected distinct arrays (each advances once)")
        kernel = self._kernel("adamw_step.cu", "advance_counters")
        for group in groups(checked):
            kernel((1,), (32,), (self._table(group), np.int32(len(group)), _flag("ok", ok)))

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
                strided_blocks(param.size),
                (BLOCK,),
                (param, grad, exp_avg, exp_avg_sq, *args, np.int64(param.size)),
            )

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
                    _one(f"grad_scales[{i}]", scale, _F64),
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
        for group in groups([t for t in tensors if t[0].size]):
            layout = self._layout([t[0].size for t in group], MULTI_CHUNK)
            tables = [
                self._table([t[role] for t in group], persistent=role not in fresh)
                for role in range(7)
            ]
            kernel((layout.blocks,), (BLOCK,), (*tables, *layout.args, *scalars))

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
        for group in groups([pair for pair in pairs if pair[0].size]):
            layout = self._layout([dst.size for dst, _ in group], MULTI_CHUNK)
            tables = (self._table([d for d, _ in group]), self._table([s for _, s in group]))
            kernel((layout.blocks,), (BLOCK,), (*tables, *layout.args, *args))
