"""The op set: what the trainer may ask of a backend, one method per kernel.

`OpSet` states each op with the NumPy twin's signature, generic in the array type: the NumPy
module `numpy_ops` is an `OpSet[np.ndarray]` and `cuda.ops.CudaOps` an `OpSet[cupy.ndarray]`.
`numpy_ops` holds what each op computes (its docstrings and code are the reference); a CUDA
op may accept more (a float64 device scalar wherever the twin takes a float), never less.
mypy proves both conform (`.ci/run`); `tests/backend/test_opset.py` also compares the parameter
names, which mypy does not check for positional parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

__all__ = ["OP_NAMES", "OpSet"]

A = TypeVar("A")  # the backend's array type


class OpSet(Protocol[A]):
    """Every op of a backend, grouped by kernel file (`kernels/*.cu`)."""

    # cuBLAS and reduce_axis0.cu
    def matmul(self, a: A, b: A) -> A: ...
    def linear_fwd(self, x: A, W: A, b: A) -> A: ...
    def linear_bwd_input(self, W: A, grad_y: A) -> A: ...
    def linear_bwd_params(self, x: A, grad_y: A) -> tuple[A, A]: ...
    def reduce_axis0(self, x: A) -> A: ...

    # linear_heads.cu
    def linear_heads_fwd(self, h: A, Ws: Sequence[A], bs: Sequence[A]) -> list[A]: ...
    def linear_heads_bwd_input(
        self, Ws: Sequence[A], grad_ys: Sequence[A], weights: Sequence[float]
    ) -> A: ...
    def linear_heads_bwd_params(self, h: A, grad_ys: Sequence[A]) -> tuple[list[A], list[A]]: ...

    # encoder.cu, grad_h_accumulate.cu
    def bias_relu_fwd(self, z: A, b: A) -> A: ...
    def bias_relu_bwd(self, h: A, grad_h: A) -> A: ...
    def grad_h_stack(self, top: A, bottom: A, weight: float) -> A: ...

    # perception_heads.cu
    def bce_fwd_bwd(self, u: A, y: A) -> tuple[A, A]: ...
    def aux_mse_fwd_bwd(self, pred: A, target: A) -> tuple[A, A]: ...

    # dqn_distributional_q.cu, categorical_projection.cu
    def c51_support(self, v_min: float, v_max: float, num_atoms: int, dtype: np.dtype) -> A: ...
    def c51_softmax(self, logits: A) -> A: ...
    def c51_q_values(self, probs: A, support: A) -> A: ...
    def c51_greedy(self, logits: A, bias: A, support: A) -> tuple[A, A]: ...
    def categorical_projection(self, next_probs: A, rewards: A, dones: A, horizons: A,
                               gamma: float, v_min: float, v_max: float) -> A: ...  # fmt: skip
    def c51_support_clip_ratio(self, next_probs: A, rewards: A, dones: A, horizons: A,
                               gamma: float, v_min: float, v_max: float) -> A: ...  # fmt: skip
    def c51_taken_loss_bwd(self, h: A, W: A, b: A, actions: A, target: A) -> tuple[A, A, A]: ...
    def c51_taken_grad_params(
        self, h: A, actions: A, grad_taken: A, num_actions: int
    ) -> tuple[A, A]: ...

    # ppo_clipped_surrogate.cu
    def log_softmax(self, logits: A) -> A: ...
    def ppo_surrogate_fwd_bwd(
        self, logits: A, actions: A, behavior_log_probs: A, advantages: A, clip_eps: float,
        ent_coef: float,
    ) -> tuple[dict[str, A], A]: ...  # fmt: skip
    def normalize_advantages(self, advantages: A) -> A: ...
    def kickstart_fwd_bwd(
        self, logits: A, feature: A, actions: tuple[int, int, int], weight: float
    ) -> tuple[A, A]: ...

    # v_head_fwd_bwd.cu
    def value_fwd_bwd(
        self, values: A, returns: A, old_values: A, clip_eps: float | None
    ) -> tuple[A, A]: ...

    # gae.cu
    def gae(self, rewards: A, values: A, next_values: A, terminated: A, truncated: A,
            gamma: float, lam: float) -> tuple[A, A]: ...  # fmt: skip

    # grad_norm_clip.cu
    def all_finite(self, arrays: Sequence[A]) -> A: ...
    def global_norm(self, grads: Sequence[A]) -> A: ...
    def group_norms(self, grads: Sequence[A], group_sizes: Sequence[int]) -> A: ...
    def clip_coefficient(self, norm: A, max_norm: float) -> A: ...

    # adamw_step.cu, target_refresh.cu
    def advance_counter(self, counter: A, ok: A) -> None: ...
    def advance_counters(self, counters: Sequence[A], ok: A) -> None: ...
    def adamw_step(self, param: A, grad: A, exp_avg: A, exp_avg_sq: A, step: A, lr: float,
                   beta1: float, beta2: float, eps: float, weight_decay: float, grad_scale: A,
                   ok: A) -> None: ...  # fmt: skip
    def adamw_steps(self, params: Sequence[A], grads: Sequence[A], exp_avgs: Sequence[A],
                    exp_avg_sqs: Sequence[A], steps: Sequence[A], lr: float, beta1: float,
                    beta2: float, eps: float, weight_decays: Sequence[float],
                    grad_scales: Sequence[A], ok: A) -> None: ...  # fmt: skip
    def target_refresh(self, target: Sequence[A], online: Sequence[A], updates: A, period: int,
                       tau: float, ok: A) -> None: ...  # fmt: skip

    # step_stats.cu
    def step_stats_accumulate(
        self, totals: A, values: Sequence[A | None], ok: A, first: bool
    ) -> None: ...

    # act.cu
    def sample_categorical(self, logits: A, uniforms: A) -> A: ...
    def act_select(self, logits: A, q_values: A | None, mode: object, epsilon: float, key: A,
                   sequence: A) -> tuple[A, A]: ...  # fmt: skip

    # replay.cu, minibatch.cu
    def replay_sample_indices(self, size: A, key: A, sequence: A, count: int) -> A: ...
    def replay_gather(self, storage: Mapping[str, A], slots: A) -> dict[str, A]: ...
    def minibatch_order(self, key: A, sequence: int, rows: int) -> A: ...
    def gather_rows(self, arrays: Sequence[A], rows: A) -> list[A]: ...


OP_NAMES: tuple[str, ...] = tuple(
    name for name, member in vars(OpSet).items() if callable(member) and not name.startswith("_")
)  # in declaration order


if TYPE_CHECKING:  # mypy checks that both backends implement every op
    from service.backend import numpy_ops
    from service.backend.cuda.ops import CudaOps

    _numpy_ops: OpSet[np.ndarray] = numpy_ops

    def _cuda_ops(ops: CudaOps) -> OpSet[Any]:
        return ops
