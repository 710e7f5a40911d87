"""A Step's optimizer updates: device work only, what a captured call replays.

Every update (one minibatch) runs one encoder pass over the rollout minibatch stacked on a
replay batch. The policy, value, BCE and aux heads read the rollout rows, the C51 head reads
the replay rows. Each head learns from its own loss; the encoder learns from
grad_h = Σ_head λ_head grad_h_head. One gradient norm over every tensor (or one per group)
clips them, and every group (encoder, each head) steps its own AdamW state. A non-finite loss
or gradient leaves the whole update unapplied.

Hyper-parameters, the Philox key and sequences, the replay size and the minibatch rows are
device data the updates read, so nothing on the host changes inside a capture, and the
non-finite guard is the `ok` flag the optimizer kernels take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from types import ModuleType
from typing import TypeVar

import numpy as np

from service.backend.executor import Executor
from service.trainer import model
from service.trainer.hyper import KICKSTART, ZERO
from service.trainer.state import State
from service.types import Transitions

T = TypeVar("T")

# The statistics vector a Step accumulates on the device and reads back once: sums over the
# applied updates of each loss and statistic, then the applied and skipped update counts,
# then one flag per head loss: non-finite in some update.
LOSS_HEADS = ("q", "pi", "v", "bce", "aux")
STATS = (
    *(f"loss_{h}" for h in LOSS_HEADS),
    "grad_norm",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "c51_support_clip_ratio",
)
APPLIED, SKIPPED, BAD = len(STATS), len(STATS) + 1, len(STATS) + 2
SIDE_HEADS_LANE = 3  # the value and perception heads' lane, beside the policy head's
STATS_SIZE = BAD + len(LOSS_HEADS)


@dataclass(frozen=True)
class Batch:
    """The on-policy arrays of a Step, flattened to [T·N] rows."""

    obs: np.ndarray
    actions: np.ndarray
    behavior_log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    old_values: np.ndarray
    bce_labels: np.ndarray | None
    aux_targets: np.ndarray | None
    guard: np.ndarray  # [1]: 0, or NaN when the rollout holds a bad value (no update applies)


def batch_arrays(batch: Batch) -> tuple:
    """The batch's arrays in field order (None for absent labels)."""
    return tuple(getattr(batch, f.name) for f in fields(batch))


def present(batch: Batch, use_q: bool) -> dict[str, bool]:
    """Which head losses an update of this batch computes."""
    return {
        "q": use_q,
        "pi": True,
        "v": True,
        "bce": batch.bce_labels is not None,
        "aux": batch.aux_targets is not None,
    }


def update_key(
    order: np.ndarray, bounds: list[tuple[int, int]], batch: Batch, use_q: bool
) -> tuple:
    """The key of a Step's captured updates: what fixes their shape (rows, minibatches, and
    the heads they train)."""
    return ("step", order.size, tuple(bounds), *present(batch, use_q).values())


def _stack_rows(xp: ModuleType, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """[top; bottom] by two copies (CuPy's concatenate may upload pointers: not in a graph)."""
    out = xp.empty((top.shape[0] + bottom.shape[0], *top.shape[1:]), dtype=top.dtype)
    out[: top.shape[0]] = top
    out[top.shape[0] :] = bottom
    return out


class Updates:
    """The optimizer updates of a Step on the parameters of `state`, run by `executor`."""

    def __init__(self, state: State, executor: Executor) -> None:
        self.state, self.executor = state, executor
        self.ops = state.backend.ops

    def run(
        self, batch: Batch, order: np.ndarray, bounds: list[tuple[int, int]], use_q: bool
    ) -> np.ndarray:
        """Queue a Step's updates, update k on the batch rows order[bounds[k][0]:bounds[k][1]],
        run or replayed under `update_key`; returns the device statistics vector (STATS_SIZE)."""
        state = self.state
        state.sequences["updates_attempted"].fill(int(state.counters["updates_attempted"][0]))

        def updates(*arrays: np.ndarray) -> np.ndarray:
            return self._all(Batch(*arrays[:-1]), arrays[-1], bounds, use_q)

        key = update_key(order, bounds, batch, use_q)
        return self.executor.run(key, updates, *batch_arrays(batch), order)

    def _all(
        self, batch: Batch, order: np.ndarray, bounds: list[tuple[int, int]], use_q: bool
    ) -> np.ndarray:
        """The device work of a Step's updates, into a new statistics vector."""
        totals = self.state.xp.empty(STATS_SIZE, dtype=np.float64)
        for k, (start, stop) in enumerate(bounds):
            self.update(batch, order[start:stop], use_q, totals, first=k == 0)
        return totals

    def q_target(self, replay: Transitions) -> tuple[np.ndarray, tuple]:
        """The projected C51 target m [Bq, Z] for a replay batch, from the target network, and
        the projection's arguments (for `c51_support_clip_ratio`)."""
        state, ops = self.state, self.ops
        cfg, hp, params, target = state.config, state.hp, state.params, state.target
        A, Z, depth = cfg.model.num_actions, cfg.c51.num_atoms, cfg.model.depth
        h_next = model.encoder_fwd(ops, target, replay.next_obs, depth)[-1]
        if cfg.c51.double_dqn:  # the online network picks a*, the target network scores it
            target_logits = model.head_fwd(ops, target, "q", h_next).reshape(-1, A, Z)
            h_online = model.encoder_fwd(ops, params, replay.next_obs, depth)[-1]
            online_z = ops.matmul(h_online, params["q/W"]).reshape(-1, A, Z)
            best, _ = ops.c51_greedy(online_z, params["q/b"], state.support)
            rows = state.xp.arange(best.shape[0]) * A + best  # one index array: a plain gather
            next_probs = ops.c51_softmax(target_logits).reshape(-1, Z)[rows]
        else:  # a* and its distribution in one pass over the target's logits (bias added there)
            target_z = ops.matmul(h_next, target["q/W"]).reshape(-1, A, Z)
            _, next_probs = ops.c51_greedy(target_z, target["q/b"], state.support)
        args = (
            next_probs,
            replay.rewards,
            replay.dones,
            replay.horizons,
            hp["train.gamma"],
            hp["c51.v_min"],
            hp["c51.v_max"],
        )
        return ops.categorical_projection(*args), args

    def update(
        self, batch: Batch, rows: np.ndarray, use_q: bool, totals: np.ndarray, first: bool
    ) -> None:
        """One optimizer update on rollout rows `rows` (+ a replay batch when `use_q`), its
        statistics added to `totals` (which the Step's `first` update resets). Device work
        only: no host reads, no uploads."""
        state, ops, executor = self.state, self.ops, self.executor
        cfg, params, hp = state.config, state.params, state.hp
        depth = cfg.model.depth
        sequence = state.sequences["updates_attempted"]
        replay = support_clip = None
        # Work nothing downstream waits for (weight gradients, a statistic) overlaps the rest
        # of the chain on a side lane, joined before the optimizer step. The functions (holding
        # the arrays they read) stay referenced until joined: a freed input could otherwise be
        # reused by the chain while they still read it.
        aside: list[tuple[object, Callable]] = []

        def beside(fn: Callable[[], T], lane: int = 0) -> T:
            result, token = executor.fork(fn, lane)
            aside.append((token, fn))
            return result

        if use_q:
            slots = self._replay_slots(sequence)
            replay = Transitions(**ops.replay_gather(state.replay.storage, slots))
            # The target network's forward and projection overlap the online network's work.
            (target, projection_args), target_ready = executor.fork(lambda: self.q_target(replay))

        xp = state.xp
        minibatch = self._minibatch(batch, rows)
        x = minibatch.obs
        on_policy = x.shape[0]
        if replay is not None:
            x = _stack_rows(xp, x, replay.obs)
        activations = model.encoder_fwd(ops, params, x, depth)
        h = activations[-1]

        grads: dict[str, np.ndarray] = {}
        losses: dict[str, np.ndarray] = {}
        # The on-policy heads overlap the Q head (both read h, neither writes what the other
        # reads); their encoder gradient is joined before the encoder's backward.
        (grad_h, pi_stats, head_grads), policy_ready = executor.fork(
            lambda: self._on_policy_heads(minibatch, h[:on_policy], losses), lane=1
        )
        grads.update(beside(head_grads, lane=1))
        if replay is not None:
            h_q = h[on_policy:]
            executor.join(target_ready)
            clip_ratio = lambda: ops.c51_support_clip_ratio(*projection_args)  # noqa: E731
            support_clip = beside(clip_ratio)
            # Only each row's taken action is computed: its logits, loss and gradients.
            losses["q"], grad_h_taken, grad_taken = ops.c51_taken_loss_bwd(
                h_q, params["q/W"], params["q/b"], replay.actions, target
            )
            A = cfg.model.num_actions
            q_params = lambda: ops.c51_taken_grad_params(h_q, replay.actions, grad_taken, A)  # noqa: E731
            grads["q/W"], grads["q/b"] = beside(q_params, lane=2)
        executor.join(policy_ready)
        if replay is not None:
            grad_h = ops.grad_h_stack(grad_h, grad_h_taken, hp["train.lambda_q"])
        grads.update(model.encoder_bwd(ops, params, activations, grad_h, depth, beside))
        for token, _fn in aside:
            executor.join(token)

        names = [name for name in params if name in grads]  # fixed parameter order
        guard = batch.guard
        if state.sharding.parallel:  # every rank then holds the whole Step's means
            guard, support_clip = self._sum_over_ranks(
                names, grads, losses, pi_stats, support_clip, guard
            )
        norm, scales = self._clip_scales(names, grads)
        ok = ops.all_finite([*(xp.atleast_1d(v) for v in losses.values()), norm, guard])
        self.apply(names, grads, scales, ok, use_q)
        ops.advance_counter(sequence, state.always)  # the next update's replay draw
        statistics = {f"loss_{head}": loss for head, loss in losses.items()}
        statistics.update(grad_norm=norm, c51_support_clip_ratio=support_clip)
        statistics.update({k: pi_stats[k] for k in ("entropy", "approx_kl", "clip_fraction")})
        ops.step_stats_accumulate(totals, [statistics.get(name) for name in STATS], ok, first)

    def _replay_slots(self, sequence: np.ndarray) -> np.ndarray:
        """The storage rows of an update's replay batch. With data shards, shard s draws rows
        [s·B/S, (s+1)·B/S) of the batch from its own ring: a rank draws its shards' part."""
        state, cfg = self.state, self.state.config
        drawn = self.ops.replay_sample_indices(
            state.replay.size_on_device, state.key_on_device, sequence, cfg.replay.batch_size
        )
        sharding = state.sharding
        if sharding.shards == 1:
            return drawn
        per, ring = cfg.replay.batch_size // sharding.shards, state.replay.capacity
        # Slice assignments, not a concatenate: a CUDA graph holds them.
        slots = state.xp.empty(per * len(sharding.owned), dtype=np.int32)
        for j, s in enumerate(sharding.owned):
            slots[j * per : (j + 1) * per] = drawn[s * per : (s + 1) * per] + j * ring
        return slots

    def _normalize_over_ranks(self, advantages: np.ndarray) -> np.ndarray:
        """normalize_advantages over the whole minibatch, every rank's rows: its mean, then
        the mean square about it, each summed over the ranks (the two passes of the op)."""
        xp, comm = self.state.xp, self.state.sharding.comm
        sums = xp.empty(3, dtype=np.float64)  # Σ Â, the row count, Σ (Â - mean)²
        sums[0:1] = advantages.sum(dtype=np.float64)
        sums[1:2] = advantages.size
        comm.all_reduce_sum(sums[0:2])
        centered = advantages - (sums[0] / sums[1]).astype(advantages.dtype)
        sums[2:3] = (centered * centered).sum(dtype=np.float64)
        comm.all_reduce_sum(sums[2:3])
        std = xp.sqrt(sums[2] / sums[1]).astype(advantages.dtype)
        return centered / (std + advantages.dtype.type(1e-8))

    def _sum_over_ranks(
        self,
        names: list[str],
        grads: dict[str, np.ndarray],
        losses: dict[str, np.ndarray],
        pi_stats: dict[str, np.ndarray],
        support_clip: np.ndarray | None,
        guard: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One all-reduce of one flat buffer: the gradients, losses and statistics (each a mean
        over this rank's rows, so their sum over the ranks / W is the whole Step's mean, the
        ranks holding equal shares) and the rollout guard (NaN on one rank: NaN on all).
        Replaces the means in the dicts; returns the whole Step's guard and support-clip ratio."""
        xp, comm = self.state.xp, self.state.sharding.comm
        stat_names = ("entropy", "approx_kl", "clip_fraction")
        parts = [grads[name] for name in names]
        parts += [losses[head] for head in losses]
        parts += [pi_stats[key] for key in stat_names]
        parts += [xp.zeros(1) if support_clip is None else support_clip, guard]
        sizes = [int(np.prod(p.shape)) for p in parts]
        flat = xp.empty(sum(sizes), dtype=np.float64)  # slice copies: a CUDA graph holds them
        start = 0
        for part, size in zip(parts, sizes, strict=True):
            flat[start : start + size] = xp.ravel(part)
            start += size
        comm.all_reduce_sum(flat)
        summed_guard = flat[-1:].astype(guard.dtype)  # a sum: NaN on one rank, NaN here
        flat /= comm.world_size
        offset = 0

        def take(like: np.ndarray) -> np.ndarray:
            nonlocal offset
            size = int(np.prod(like.shape))
            out = flat[offset : offset + size].reshape(like.shape).astype(like.dtype)
            offset += size
            return out

        for name in names:
            grads[name] = take(grads[name])
        for head in losses:
            losses[head] = take(xp.asarray(losses[head]))
        for key in stat_names:
            pi_stats[key] = take(xp.asarray(pi_stats[key]))
        if support_clip is not None:
            support_clip = take(xp.asarray(support_clip))
        return summed_guard, support_clip

    def _minibatch(self, batch: Batch, rows: np.ndarray) -> Batch:
        """The batch's rows `rows`, every per-row field gathered in one op (the guard as is)."""
        per_row = batch_arrays(batch)[:-1]
        gathered = iter(self.ops.gather_rows([a for a in per_row if a is not None], rows))
        return Batch(*(None if a is None else next(gathered) for a in per_row), guard=batch.guard)

    def _on_policy_heads(
        self,
        batch: Batch,
        h_pol: np.ndarray,
        losses: dict[str, np.ndarray],
    ) -> tuple[np.ndarray, dict, Callable[[], dict[str, np.ndarray]]]:
        """Policy, value and perception heads on a minibatch's rows: their losses into `losses`;
        returns (their λ-weighted encoder gradient, the PPO statistics, a function that queues
        their parameter gradients: the caller runs it beside the encoder's backward)."""
        ops, params, hp, ppo = self.ops, self.state.params, self.state.hp, self.state.config.ppo
        heads = ["pi", "v"]
        if batch.bce_labels is not None:  # the perception heads train when labels came
            heads.append("bce")
        if batch.aux_targets is not None:
            heads.append("aux")
        Ws = [params[f"{head}/W"] for head in heads]
        bs = [params[f"{head}/b"] for head in heads]
        outputs = dict(zip(heads, ops.linear_heads_fwd(h_pol, Ws, bs), strict=True))
        # The value and perception heads (each reads its own output, writes its own gradient)
        # overlap the policy head's chain on a side lane, joined before the heads' backward.
        (other_losses, other_grads), others_ready = self.executor.fork(
            lambda: self._value_and_perception_heads(batch, outputs), lane=SIDE_HEADS_LANE
        )

        # Policy head: PPO clipped surrogate + entropy bonus.
        advantages = batch.advantages
        if ppo.norm_adv and self.state.sharding.parallel:
            advantages = self._normalize_over_ranks(advantages)
        elif ppo.norm_adv:
            advantages = ops.normalize_advantages(advantages)
        pi_stats, grad_logits = ops.ppo_surrogate_fwd_bwd(
            outputs["pi"],
            batch.actions,
            batch.behavior_log_probs,
            advantages,
            hp["ppo.clip_eps"],
            hp["ppo.ent_coef"],
        )
        losses["pi"] = pi_stats["loss"]
        kick = self.state.config.kickstart
        # The teacher's cross-entropy, on the policy head alone; on NumPy (a host number) not
        # computed once its weight is 0, where it would add zeros.
        weight = hp[KICKSTART]
        if kick.coef and (not isinstance(weight, float) or weight > 0):
            teacher = (kick.action_below, kick.action_zero, kick.action_above)
            kick_loss, kick_grad = ops.kickstart_fwd_bwd(
                outputs["pi"], batch.obs[:, kick.feature], teacher, weight
            )
            losses["pi"] = losses["pi"] + kick_loss
            grad_logits = grad_logits + kick_grad
        losses.update(other_losses)
        grad_outputs = [grad_logits, *other_grads]
        self.executor.join(others_ready)

        lambdas = hp.weights([f"train.lambda_{head}" for head in heads])
        grad_h = ops.linear_heads_bwd_input(Ws, grad_outputs, lambdas)

        def parameter_grads() -> dict[str, np.ndarray]:
            grad_Ws, grad_bs = ops.linear_heads_bwd_params(h_pol, grad_outputs)
            named = zip(heads, grad_Ws, grad_bs, strict=True)
            return {f"{head}/{kind}": g for head, W, b in named for kind, g in (("W", W), ("b", b))}

        return grad_h, pi_stats, parameter_grads

    def _value_and_perception_heads(
        self, batch: Batch, outputs: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """The value head's loss 0.5 (v - R)² (optionally clipped around the rollout-time
        value) and the perception heads' (BCE, aux MSE) where they train: their losses and
        their output gradients, in head order."""
        ops, hp, ppo = self.ops, self.state.hp, self.state.config.ppo
        losses, grads = {}, []
        losses["v"], grad_v = ops.value_fwd_bwd(
            outputs["v"][:, 0],
            batch.returns,
            batch.old_values,
            hp["ppo.value_clip_eps"] if ppo.clip_value_loss else None,
        )
        grads.append(grad_v[:, None])
        if "bce" in outputs:
            losses["bce"], grad_u = ops.bce_fwd_bwd(outputs["bce"][:, 0], batch.bce_labels)
            grads.append(grad_u[:, None])
        if "aux" in outputs:
            losses["aux"], grad_pred = ops.aux_mse_fwd_bwd(outputs["aux"], batch.aux_targets)
            grads.append(grad_pred)
        return losses, grads

    def _clip_scales(
        self, names: list[str], grads: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The global gradient norm [1] and each tensor's clip coefficient [1]: of the global
        norm (`optim.clip_scope = "global"`), or of its optimizer group's own norm ("group":
        a spike in one head's gradient then shrinks that head's step alone)."""
        ops, max_norm = self.ops, self.state.hp["optim.max_grad_norm"]
        tensors = [grads[name] for name in names]
        if self.state.config.optim.clip_scope == "global":
            norm = ops.global_norm(tensors)
            return norm, [ops.clip_coefficient(norm, max_norm)] * len(names)
        owners = [model.group_of(name) for name in names]
        groups = list(dict.fromkeys(owners))  # names come group by group
        norms = ops.group_norms(tensors, [owners.count(group) for group in groups])
        coefficients = ops.clip_coefficient(norms[: len(groups)], max_norm)
        index = {group: j for j, group in enumerate(groups)}
        scales = [coefficients[index[g] : index[g] + 1] for g in owners]
        return norms[len(groups) :], scales

    def apply(
        self,
        names: list[str],
        grads: dict[str, np.ndarray],
        scales: list[np.ndarray],
        ok: np.ndarray,
        use_q: bool,
    ) -> None:
        """Step each group's AdamW on the clipped gradients, refresh the target network."""
        ops, state, hp = self.ops, self.state, self.state.hp
        groups = {model.group_of(name): None for name in names}
        ops.advance_counters([state.optim_steps[group] for group in groups], ok)
        ops.adamw_steps(
            [state.params[name] for name in names],
            [grads[name] for name in names],
            [state.exp_avg[name] for name in names],
            [state.exp_avg_sq[name] for name in names],
            [state.optim_steps[model.group_of(name)] for name in names],
            hp["optim.lr"],
            hp["optim.beta1"],
            hp["optim.beta2"],
            hp["optim.eps"],
            [hp["optim.weight_decay"] if model.is_weight_matrix(n) else hp[ZERO] for n in names],
            scales,
            ok,
        )
        if use_q:  # the target tracks the Q head's updates
            target_names = list(state.target)
            ops.target_refresh(
                [state.target[name] for name in target_names],
                [state.params[name] for name in target_names],
                state.optim_steps["q"],
                state.config.c51.target_update_period,
                hp["c51.target_tau"],
                ok,
            )
