"""The integrated trainer: one Step = GAE, PPO epochs × minibatches, C51 on replay, AdamW.

Every update (one minibatch) runs one encoder pass over the rollout minibatch stacked on a
replay batch. The policy, value, BCE and aux heads read the rollout rows, the C51 head reads
the replay rows. Each head learns from its own loss; the encoder learns from
grad_h = Σ_head λ_head grad_h_head. One global gradient norm over every tensor clips all of
them, and every group (encoder, each head) steps its own AdamW state. A non-finite loss or
gradient leaves the whole update unapplied.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from service.backend import Backend, select_backend
from service.backend.philox import Stream, below, random_bits, seed_key, uniform01
from service.config import Config, ConfigError, with_overrides
from service.errors import InvalidInput
from service.trainer import model
from service.trainer.replay import ReplayBuffer
from service.trainer.rollout import (
    Rollout,
    Transitions,
    next_observations,
    nstep_transitions,
    validate_rollout,
)

# Settings UpdateHyperparams may change between Steps (a GPU backend keeps them in a device
# vector, so changing them never re-captures the step).
HOT_KEYS = (
    "optim.lr",
    "optim.weight_decay",
    "optim.max_grad_norm",
    "train.gamma",
    "train.lambda_q",
    "train.lambda_pi",
    "train.lambda_v",
    "train.lambda_bce",
    "train.lambda_aux",
    "ppo.gae_lambda",
    "ppo.clip_eps",
    "ppo.ent_coef",
    "ppo.value_clip_eps",
    "c51.target_tau",
)

COUNTERS = ("global_step", "updates_attempted", "act_calls")


class ActMode(Enum):
    SAMPLE = "sample"  # a ~ π(·|s)
    GREEDY_PI = "greedy_pi"  # argmax_a π(a|s)
    GREEDY_Q = "greedy_q"  # argmax_a E[Z(s, a)]
    EPSILON_GREEDY = "epsilon_greedy"  # uniform action with probability ε, else greedy-Q


@dataclass(frozen=True)
class ActResult:
    actions: np.ndarray  # [N] int32
    log_probs: np.ndarray  # [N] log π(a|s) of the returned action, whatever the mode
    values: np.ndarray  # [N] V(s)
    policy_version: int


@dataclass
class StepResult:
    """What one Step did. Losses and statistics are means over the applied updates."""

    losses: dict[str, float] = field(default_factory=dict)  # q, pi, v, bce, aux, total
    grad_norm: float = 0.0  # before clipping
    entropy: float = 0.0
    approx_kl: float = 0.0
    clip_fraction: float = 0.0
    c51_support_clip_ratio: float = 0.0  # share of C51 target mass clipped at the support ends
    updates_applied: int = 0
    updates_skipped: int = 0
    skipped: bool = False  # at least one update was left unapplied
    skip_reason: str = ""
    global_step: int = 0
    policy_lag: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Batch:
    """The on-policy arrays of a Step, flattened to [T·N] rows."""

    obs: np.ndarray
    actions: np.ndarray
    behavior_log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    old_values: np.ndarray
    bce_labels: np.ndarray | None
    aux_targets: np.ndarray | None


class Trainer:
    """Encoder, C51 / policy / value / perception heads, target network, replay and optimizers."""

    def __init__(self, config: Config, backend: Backend | None = None) -> None:
        self.config = config
        self.backend = backend or select_backend(config.train.backend, model.dims(config))
        self.ops = self.backend.ops
        xp = self.xp = self.backend.xp
        self.dtype = np.dtype(config.model.dtype)
        self.key = seed_key(config.train.seed)
        self.params = {k: xp.asarray(v) for k, v in model.init_params(config).items()}
        self.target = {k: v.copy() for k, v in self.params.items() if self._in_target(k)}
        self.exp_avg = {k: xp.zeros_like(v) for k, v in self.params.items()}
        self.exp_avg_sq = {k: xp.zeros_like(v) for k, v in self.params.items()}
        self.optim_steps = {g: xp.zeros(1, dtype=np.int64) for g in model.groups(config)}
        # Host counters: they pick the Philox sequence of each draw and the policy version.
        self.counters = {name: np.zeros(1, dtype=np.int64) for name in COUNTERS}
        self.replay = ReplayBuffer(config.replay.capacity, config.model.obs_dim, self.dtype, xp)
        self.support = self.ops.c51_support(
            config.c51.v_min, config.c51.v_max, config.c51.num_atoms, self.dtype
        )

    @staticmethod
    def _in_target(name: str) -> bool:
        return model.group_of(name) in ("encoder", "q")

    @property
    def global_step(self) -> int:
        """Applied Steps so far; also the policy version Act reports."""
        return int(self.counters["global_step"][0])

    # ------------------------------------------------------------------------------ Step
    def step(self, rollout: Rollout) -> StepResult:
        """Apply one Step. Raises InvalidInput (changing nothing) on malformed input."""
        validate_rollout(rollout, self.config)
        result = StepResult(global_step=self.global_step)
        if rollout.policy_version is not None:
            result.policy_lag = self.global_step - rollout.policy_version
        for name, values in rollout.float_fields().items():
            if not np.isfinite(values).all():
                result.skipped = True
                result.skip_reason = f"non-finite values in {name}; Step not applied"
                return result

        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._apply_step(rollout, result)  # the guard reports non-finite values

    def _apply_step(self, rollout: Rollout, result: StepResult) -> StepResult:
        started = time.perf_counter()
        batch, next_obs = self._prepare(rollout)
        c51, gamma = self.config.c51, self.config.train.gamma
        self.replay.insert(nstep_transitions(rollout, next_obs, c51.n_step, gamma, self.dtype))
        prepared = time.perf_counter()  # "prepare": values, GAE and the replay insert

        totals: dict[str, float] = {}
        rows = batch.actions.shape[0]
        ppo = self.config.ppo
        for _epoch in range(ppo.epochs):
            sequence = int(self.counters["updates_attempted"][0])
            keys = random_bits(self.key, Stream.MINIBATCH, sequence, rows)[:, 0]
            order = np.argsort(keys, kind="stable")  # a seeded permutation of the rows
            for minibatch in np.array_split(order, min(ppo.num_minibatches, rows)):
                stats, reason = self._update(batch, minibatch)
                self.counters["updates_attempted"] += 1
                if reason:
                    result.updates_skipped += 1
                    result.skip_reason = result.skip_reason or reason
                    continue
                result.updates_applied += 1
                for name, value in stats.items():
                    totals[name] = totals.get(name, 0.0) + value

        applied = max(result.updates_applied, 1)
        means = {name: value / applied for name, value in totals.items()}
        result.losses = {k.removeprefix("loss_"): v for k, v in means.items() if "loss_" in k}
        result.grad_norm = means.get("grad_norm", 0.0)
        result.entropy = means.get("entropy", 0.0)
        result.approx_kl = means.get("approx_kl", 0.0)
        result.clip_fraction = means.get("clip_fraction", 0.0)
        result.c51_support_clip_ratio = means.get("c51_support_clip_ratio", 0.0)
        result.skipped = result.updates_skipped > 0
        if result.updates_applied:
            self.counters["global_step"] += 1
        result.global_step = self.global_step
        finished = time.perf_counter()
        result.timings_ms = {
            "prepare": 1e3 * (prepared - started),
            "update": 1e3 * (finished - prepared),
            "total": 1e3 * (finished - started),
        }
        return result

    def _prepare(self, rollout: Rollout) -> tuple[_Batch, np.ndarray]:
        """Values of every observation, GAE, and the flat on-policy batch."""
        T, N, D = rollout.horizon, rollout.num_envs, self.config.model.obs_dim
        xp, dev = self.xp, self._device
        next_obs = next_observations(rollout, self.dtype)
        truncated = np.flatnonzero(rollout.truncated.reshape(-1))
        # One forward over obs[0..T] and the final observations of truncated steps.
        final = next_obs.reshape(T * N, D)[truncated]
        stacked = dev(np.concatenate([rollout.obs.astype(self.dtype).reshape(-1, D), final]))
        values = self._values(stacked)
        v_obs = values[: (T + 1) * N].reshape(T + 1, N)
        v_next = v_obs[1:].reshape(-1).copy()
        v_next[dev(truncated)] = values[(T + 1) * N :]  # truncation bootstraps from V(final)
        advantages, returns = self.ops.gae(
            dev(rollout.rewards.astype(self.dtype)),
            xp.ascontiguousarray(v_obs[:T]),
            v_next.reshape(T, N),
            dev(rollout.terminated.astype(np.uint8)),
            dev(rollout.truncated.astype(np.uint8)),
            self.config.train.gamma,
            self.config.ppo.gae_lambda,
        )
        K = self.config.model.aux_dim
        batch = _Batch(
            obs=dev(rollout.obs[:T].astype(self.dtype).reshape(T * N, D)),
            actions=dev(rollout.actions.astype(np.int32).reshape(-1)),
            behavior_log_probs=dev(rollout.behavior_log_probs.astype(self.dtype).reshape(-1)),
            advantages=advantages.reshape(-1),
            returns=returns.reshape(-1),
            old_values=xp.ascontiguousarray(v_obs[:T]).reshape(-1),
            bce_labels=None
            if rollout.bce_labels is None
            else dev(rollout.bce_labels.astype(self.dtype).reshape(-1)),
            aux_targets=None
            if rollout.aux_targets is None
            else dev(rollout.aux_targets.astype(self.dtype).reshape(T * N, K)),
        )
        return batch, next_obs

    def _device(self, array: np.ndarray) -> np.ndarray:
        """A host array on the backend's device (the same array on NumPy)."""
        return self.xp.asarray(array)

    def _values(self, obs: np.ndarray) -> np.ndarray:
        depth = self.config.model.depth
        h = model.encoder_fwd(self.ops, self.params, obs, depth)[-1]
        return model.head_fwd(self.ops, self.params, "v", h)[:, 0]

    def _q_target(self, replay: Transitions) -> tuple[np.ndarray, float]:
        """The projected C51 target m [Bq, Z] for a replay batch, from the target network, and
        the share of its mass clipped at the ends of the support."""
        cfg, ops = self.config, self.ops
        A, Z, depth = cfg.model.num_actions, cfg.c51.num_atoms, cfg.model.depth
        h_next = model.encoder_fwd(ops, self.target, replay.next_obs, depth)[-1]
        target_probs = model.q_distribution(ops, self.target, h_next, A, Z)
        if cfg.c51.double_dqn:  # the online network picks a*, the target network scores it
            h_online = model.encoder_fwd(ops, self.params, replay.next_obs, depth)[-1]
            chooser = model.q_distribution(ops, self.params, h_online, A, Z)
        else:
            chooser = target_probs
        best = self.xp.argmax(ops.c51_q_values(chooser, self.support), axis=1)
        next_probs = target_probs[self.xp.arange(best.shape[0]), best]
        args = (
            next_probs,
            replay.rewards,
            replay.dones,
            replay.horizons,
            cfg.train.gamma,
            cfg.c51.v_min,
            cfg.c51.v_max,
        )
        return ops.categorical_projection(*args), float(ops.c51_support_clip_ratio(*args))

    def _update(self, batch: _Batch, rows: np.ndarray) -> tuple[dict[str, float], str]:
        """One optimizer update on rollout rows `rows` (+ a replay batch once it is warm).

        Returns (statistics, skip reason); the reason is empty when the update was applied.
        """
        cfg, ops, params = self.config, self.ops, self.params
        train, ppo = cfg.train, cfg.ppo
        depth, A, Z = cfg.model.depth, cfg.model.num_actions, cfg.c51.num_atoms
        use_q = len(self.replay) >= cfg.replay.min_size
        replay = None
        if use_q:
            sequence = int(self.counters["updates_attempted"][0])
            replay = self.replay.sample(self.key, sequence, cfg.replay.batch_size)

        xp = self.xp
        rows = self._device(rows)
        x = batch.obs[rows]
        on_policy = x.shape[0]
        if replay is not None:
            x = xp.concatenate([x, replay.obs])
        activations = model.encoder_fwd(ops, params, x, depth)
        h = activations[-1]
        h_pol = h[:on_policy]

        grads: dict[str, np.ndarray] = {}
        losses: dict[str, np.ndarray] = {}
        grad_h_heads: list[np.ndarray] = []
        weights: list[float] = []

        # Policy head: PPO clipped surrogate + entropy bonus.
        advantages = batch.advantages[rows]
        if ppo.norm_adv:
            advantages = ops.normalize_advantages(advantages)
        pi_stats, grad_logits = ops.ppo_surrogate_fwd_bwd(
            model.head_fwd(ops, params, "pi", h_pol),
            batch.actions[rows],
            batch.behavior_log_probs[rows],
            advantages,
            ppo.clip_eps,
            ppo.ent_coef,
        )
        losses["pi"] = pi_stats["loss"]
        self._head_bwd("pi", h_pol, grad_logits, grads, grad_h_heads, weights)

        # Value head: 0.5 (v - R)², optionally clipped around the rollout-time value.
        v_loss, grad_v = ops.value_fwd_bwd(
            model.head_fwd(ops, params, "v", h_pol)[:, 0],
            batch.returns[rows],
            batch.old_values[rows],
            ppo.value_clip_eps if ppo.clip_value_loss else None,
        )
        losses["v"] = v_loss
        self._head_bwd("v", h_pol, grad_v[:, None], grads, grad_h_heads, weights)

        # Perception heads, when the rollout carries their labels.
        if batch.bce_labels is not None:
            u = model.head_fwd(ops, params, "bce", h_pol)[:, 0]
            losses["bce"], grad_u = ops.bce_fwd_bwd(u, batch.bce_labels[rows])
            self._head_bwd("bce", h_pol, grad_u[:, None], grads, grad_h_heads, weights)
        if batch.aux_targets is not None:
            pred = model.head_fwd(ops, params, "aux", h_pol)
            losses["aux"], grad_pred = ops.aux_mse_fwd_bwd(pred, batch.aux_targets[rows])
            self._head_bwd("aux", h_pol, grad_pred, grads, grad_h_heads, weights)

        grad_h = ops.grad_h_accumulate(grad_h_heads, weights)
        if replay is not None:
            h_q = h[on_policy:]
            q_logits = model.head_fwd(ops, params, "q", h_q).reshape(-1, A, Z)
            target, support_clip = self._q_target(replay)
            losses["q"], grad_taken = ops.c51_cross_entropy_fwd_bwd(
                q_logits, replay.actions, target
            )
            grad_h_q, grads["q/W"], grads["q/b"] = ops.c51_head_bwd(
                h_q, params["q/W"], replay.actions, grad_taken, Z
            )
            grad_h = xp.concatenate([grad_h, ops.grad_h_accumulate([grad_h_q], [train.lambda_q])])
        grads.update(model.encoder_bwd(ops, params, activations, grad_h, depth))

        names = [name for name in params if name in grads]  # fixed parameter order
        grad_list = [grads[name] for name in names]
        norm = ops.global_norm(grad_list)
        ok = ops.all_finite([*(xp.atleast_1d(v) for v in losses.values()), norm])
        if not ok[0]:
            bad = [head for head, loss in losses.items() if not np.isfinite(float(loss))]
            where = f"loss of {', '.join(bad)}" if bad else "gradients"
            return {}, f"non-finite {where}; update not applied"
        self._apply(names, grads, norm, ok, use_q)

        stats = {f"loss_{head}": float(loss) for head, loss in losses.items()}
        lambdas = {head: getattr(train, f"lambda_{head}") for head in losses}
        stats["loss_total"] = float(sum(lambdas[h] * float(v) for h, v in losses.items()))
        stats["grad_norm"] = float(norm[0])
        for name in ("entropy", "approx_kl", "clip_fraction"):
            stats[name] = float(pi_stats[name])
        if replay is not None:
            stats["c51_support_clip_ratio"] = support_clip
        return stats, ""

    def _head_bwd(
        self,
        head: str,
        h: np.ndarray,
        grad_out: np.ndarray,
        grads: dict[str, np.ndarray],
        grad_h_heads: list[np.ndarray],
        weights: list[float],
    ) -> None:
        """Backward through a linear head; queue its λ-weighted share of the encoder gradient."""
        grad_h, grads[f"{head}/W"], grads[f"{head}/b"] = self.ops.linear_bwd(
            h, self.params[f"{head}/W"], grad_out
        )
        grad_h_heads.append(grad_h)
        weights.append(getattr(self.config.train, f"lambda_{head}"))

    def _apply(
        self,
        names: list[str],
        grads: dict[str, np.ndarray],
        norm: np.ndarray,
        ok: np.ndarray,
        use_q: bool,
    ) -> None:
        """Clip by the global norm, step each group's AdamW, refresh the target network."""
        ops, optim, c51 = self.ops, self.config.optim, self.config.c51
        coefficient = ops.clip_coefficient(norm, optim.max_grad_norm)
        for group in {model.group_of(name): None for name in names}:
            ops.advance_counter(self.optim_steps[group], ok)
        for name in names:
            ops.adamw_step(
                self.params[name],
                grads[name],
                self.exp_avg[name],
                self.exp_avg_sq[name],
                self.optim_steps[model.group_of(name)],
                optim.lr,
                optim.beta1,
                optim.beta2,
                optim.eps,
                optim.weight_decay if model.is_weight_matrix(name) else 0.0,
                coefficient,
                ok,
            )
        if use_q:  # the target tracks the Q head's updates
            target_names = list(self.target)
            ops.target_refresh(
                [self.target[name] for name in target_names],
                [self.params[name] for name in target_names],
                self.optim_steps["q"],
                c51.target_update_period,
                c51.target_tau,
                ok,
            )

    # ------------------------------------------------------------------------------ Act
    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        """Actions for observations [N, D]; each call draws fresh Philox counters."""
        D, A = self.config.model.obs_dim, self.config.model.num_actions
        if not isinstance(obs, np.ndarray) or obs.ndim != 2 or obs.shape[1] != D:
            got = list(obs.shape) if isinstance(obs, np.ndarray) else type(obs).__name__
            raise InvalidInput("obs", f"an array of shape [N, {D}]", got)
        if obs.dtype.kind != "f" or not np.isfinite(obs).all():
            raise InvalidInput("obs", "finite floating-point values", f"dtype {obs.dtype}")
        if not isinstance(mode, ActMode):
            raise InvalidInput("mode", f"one of {[m.name for m in ActMode]}", mode)
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput("epsilon", "a probability in [0, 1]", epsilon)
        ops, cfg = self.ops, self.config
        xp, x = self.xp, self._device(obs.astype(self.dtype))
        h = model.encoder_fwd(ops, self.params, x, cfg.model.depth)[-1]
        logits = model.head_fwd(ops, self.params, "pi", h)
        log_pi = ops.log_softmax(logits)
        values = model.head_fwd(ops, self.params, "v", h)[:, 0]
        rows = xp.arange(obs.shape[0])
        sequence = int(self.counters["act_calls"][0])
        self.counters["act_calls"] += 1

        if mode is ActMode.SAMPLE:
            bits = random_bits(self.key, Stream.ACT_SAMPLE, sequence, rows.size)[:, 0]
            actions = ops.sample_categorical(logits, self._device(uniform01(bits, self.dtype)))
        elif mode is ActMode.GREEDY_PI:
            actions = xp.argmax(logits, axis=1)
        else:
            probs = model.q_distribution(ops, self.params, h, A, cfg.c51.num_atoms)
            actions = xp.argmax(ops.c51_q_values(probs, self.support), axis=1)
            if mode is ActMode.EPSILON_GREEDY:
                bits = random_bits(self.key, Stream.ACT_EXPLORE, sequence, rows.size)
                explore = uniform01(bits[:, 0], np.float64) < epsilon
                random_actions = self._device(below(bits[:, 1], A))
                actions = xp.where(self._device(explore), random_actions, actions)
        actions = actions.astype(np.int32)
        host = self.backend.to_host
        return ActResult(
            actions=host(actions),
            log_probs=host(log_pi[rows, actions]),
            values=host(values),
            policy_version=self.global_step,
        )

    # ------------------------------------------------------------------------------ state
    def update_hyperparams(self, updates: Mapping[str, float]) -> None:
        """Change hot settings (HOT_KEYS) between Steps; all or nothing."""
        for key in updates:
            if key not in HOT_KEYS:
                raise InvalidInput("hyperparams", f"keys among {list(HOT_KEYS)}", repr(key))
        try:
            self.config = with_overrides(self.config, [f"{k}={v!r}" for k, v in updates.items()])
        except ConfigError as error:
            raise InvalidInput("hyperparams", "values the config allows", str(error)) from None

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every array that defines the trainer, by name `group/...` with groups params, target,
        optim, replay, counters and rng (the seed; with the counters it fixes every future draw).
        """
        host = self.backend.to_host
        return {name: host(array) for name, array in self._state_arrays().items()}

    def _state_arrays(self) -> dict[str, np.ndarray]:
        """`state_dict()`'s arrays where they live (on the device for a GPU backend)."""
        state: dict[str, np.ndarray] = {}
        state.update({f"params/{k}": v for k, v in self.params.items()})
        state.update({f"target/{k}": v for k, v in self.target.items()})
        state.update({f"optim/exp_avg/{k}": v for k, v in self.exp_avg.items()})
        state.update({f"optim/exp_avg_sq/{k}": v for k, v in self.exp_avg_sq.items()})
        state.update({f"optim/step/{k}": v for k, v in self.optim_steps.items()})
        state.update({f"replay/{k}": v for k, v in self.replay.state().items()})
        state.update({f"counters/{k}": v for k, v in self.counters.items()})
        state["rng/seed"] = np.array([self.config.train.seed], dtype=np.uint64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace the trainer's state with `state`, checked whole before anything changes."""
        mine = self.state_dict()
        missing = sorted(set(mine) - set(state))
        unknown = sorted(set(state) - set(mine))
        if missing or unknown:
            raise InvalidInput(
                "state",
                "exactly this trainer's tensors",
                f"missing {missing[:5]}, unknown {unknown[:5]}",
            )
        rows = int(np.asarray(state["replay/size"]).reshape(-1)[0])
        for name, current in mine.items():
            incoming = state[name]
            expected = current.shape
            if name.startswith("replay/") and name not in ("replay/position", "replay/size"):
                expected = (rows, *current.shape[1:])
            if incoming.dtype != current.dtype or incoming.shape != expected:
                raise InvalidInput(
                    name,
                    f"{current.dtype}{list(expected)}",
                    f"{incoming.dtype}{list(incoming.shape)}",
                )
        seed = int(state["rng/seed"][0])
        try:
            config = with_overrides(self.config, [f"train.seed={seed}"])
        except ConfigError as error:
            raise InvalidInput("rng/seed", "a valid train.seed", str(error)) from None
        for name, array in self._state_targets().items():
            self._assign(array, state[name])
        self.config = config
        self.key = seed_key(seed)
        self.replay.load_state(
            {k.removeprefix("replay/"): v for k, v in state.items() if k.startswith("replay/")}
        )

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replace the online parameters only (an inference-only server's restore)."""
        for name, current in self.params.items():
            incoming = params.get(name)
            if (
                incoming is None
                or incoming.dtype != current.dtype
                or incoming.shape != current.shape
            ):
                got = "nothing" if incoming is None else f"{incoming.dtype}{list(incoming.shape)}"
                raise InvalidInput(f"params/{name}", f"{current.dtype}{list(current.shape)}", got)
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise InvalidInput("params", "exactly this model's tensors", f"unknown {unknown[:5]}")
        for name, array in self.params.items():
            self._assign(array, params[name])

    def memory_bytes(self) -> int:
        """Bytes the backend holds for this trainer: parameters, target, moments and replay."""
        arrays = [
            *self.params.values(),
            *self.target.values(),
            *self.exp_avg.values(),
            *self.exp_avg_sq.values(),
            *self.replay.storage.values(),
        ]
        return sum(array.nbytes for array in arrays)

    def _assign(self, target: np.ndarray, source: np.ndarray) -> None:
        """Overwrite `target` (host counter or backend array) with the host array `source`."""
        target[...] = source if isinstance(target, np.ndarray) else self.xp.asarray(source)

    def _state_targets(self) -> dict[str, np.ndarray]:
        """The fixed-shape state arrays (all but the replay rows), to be overwritten in place."""
        arrays = self._state_arrays().items()
        return {k: v for k, v in arrays if not k.startswith(("replay/", "rng/"))}

    def param_digest(self) -> str:
        """sha256 over every parameter, target and optimizer tensor, in name order.

        Each tensor contributes its name, dtype, shape and little-endian bytes.
        """
        digest = hashlib.sha256()
        for name, array in sorted(self.state_dict().items()):
            if name.split("/", 1)[0] not in ("params", "target", "optim"):
                continue
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).data)
        return digest.hexdigest()
