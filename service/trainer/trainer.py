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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from types import ModuleType
from typing import TypeVar

import numpy as np

from service.backend import Backend, select_backend
from service.backend.philox import seed_key
from service.config import Config, ConfigError, with_overrides
from service.errors import InvalidInput
from service.trainer import model
from service.trainer.hyper import HOT_KEYS, ZERO, Hyperparams
from service.trainer.replay import ReplayBuffer
from service.trainer.rollout import (
    next_observations,
    nstep_transitions,
    validate_device_rollout,
    validate_rollout,
)
from service.trainer.support_watch import SupportWatch
from service.trainer.value_norm import ValueNorm, moments
from service.types import ActMode, ActResult, DeviceRollout, Rollout, StepResult, Transitions

T = TypeVar("T")

__all__ = ["HOT_KEYS", "Trainer"]

COUNTERS = ("global_step", "updates_attempted", "act_calls")
VALUE_NORM = "v/norm"  # the value head's return statistics, saved with the parameters

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
STATS_SIZE = BAD + len(LOSS_HEADS)
# The Step's readback: the statistics, the rollout guard, the value head's return statistics
# (3), then what the caller asked for.
GUARD, REPORT = STATS_SIZE, STATS_SIZE + 4


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


def _present(batch: Batch, use_q: bool) -> dict[str, bool]:
    """Which head losses an update of this batch computes."""
    return {
        "q": use_q,
        "pi": True,
        "v": True,
        "bce": batch.bce_labels is not None,
        "aux": batch.aux_targets is not None,
    }


def _stack_rows(xp: ModuleType, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """[top; bottom] by two copies (CuPy's concatenate may upload pointers: not in a graph)."""
    out = xp.empty((top.shape[0] + bottom.shape[0], *top.shape[1:]), dtype=top.dtype)
    out[: top.shape[0]] = top
    out[top.shape[0] :] = bottom
    return out


class Trainer:
    """Encoder, C51 / policy / value / perception heads, target network, replay and optimizers.

    On a CUDA backend every device call runs on the trainer's own stream and, with
    `train.cuda_graphs`, each Step shape and each Act shape becomes a CUDA graph (see
    `service/backend/cuda/capture.py`): hyper-parameters, Philox key and sequences, replay
    size and minibatch rows are device data the graph reads, so nothing on the host changes
    inside it, and the non-finite guard is the `ok` flag the optimizer kernels take.
    """

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
        self.hp = Hyperparams(config, xp)
        ppo = config.ppo
        self.value_norm = ValueNorm(xp, self.dtype, ppo.value_norm_decay, ppo.value_norm)
        self.support_watch = SupportWatch(config.c51)
        # What the device reads of the host's Philox state: the key, and the sequence of the
        # next update / Act call (filled from the counters before each launch; the update
        # advances its own between the updates of one Step).
        self.key_on_device = xp.asarray(np.array(self.key, dtype=np.uint32))
        self.sequences = {name: xp.zeros(1, dtype=np.int64) for name in COUNTERS[1:]}
        self._always = xp.ones(1, dtype=np.uint8)
        self._no_guard = xp.zeros(1, dtype=self.dtype)  # a host-checked rollout's guard
        self.stream = None if xp is np else xp.cuda.Stream(non_blocking=True)
        if self.stream is not None:
            # The state above was written on the null stream, which a non-blocking stream does
            # not wait for: the trainer's first work must come after it.
            self.stream.wait_event(xp.cuda.Stream.null.record())
        # Side streams for independent work inside an update (the target network, the
        # on-policy heads, weight gradients), joined back by events: in a captured graph,
        # parallel branches.
        self._side_streams = [] if xp is np else [xp.cuda.Stream(non_blocking=True) for _ in "abc"]
        self.graphs = None
        if self.stream is not None and config.train.cuda_graphs:
            from service.backend.cuda.capture import CapturedCalls

            self.graphs = CapturedCalls(self.stream)
        self._static: dict[tuple, tuple] = {}  # per graph key: the buffers its graph reads

    @staticmethod
    def _in_target(name: str) -> bool:
        return model.group_of(name) in ("encoder", "q")

    @property
    def global_step(self) -> int:
        """Applied Steps so far; also the policy version Act reports."""
        return int(self.counters["global_step"][0])

    @contextmanager
    def on_device(self) -> Iterator[None]:
        """Run the block's device work on the trainer's stream (nothing to do on NumPy)."""
        if self.stream is None:
            yield
            return
        with self.stream:
            yield

    def _fork(self, fn: Callable[[], T], lane: int = 0) -> tuple[T, object]:
        """fn's device work on side stream `lane`, after everything queued so far on the
        current one; returns fn's result and the token `_join` waits for (NumPy: fn())."""
        if not self._side_streams:
            return fn(), None
        side = self._side_streams[lane]
        side.wait_event(self.xp.cuda.get_current_stream().record())
        with side:
            result = fn()
        return result, side.record()

    def _join(self, token: object) -> None:
        """Make the current stream wait for a `_fork`'s work."""
        if token is not None:
            self.xp.cuda.get_current_stream().wait_event(token)

    def synchronize(self) -> None:
        """Wait for every queued device call (a no-op on NumPy)."""
        if self.stream is not None:
            self.stream.synchronize()

    # ------------------------------------------------------------------------------ Step
    def step(self, rollout: Rollout) -> StepResult:
        """Apply one Step. Raises InvalidInput (changing nothing) on malformed input."""
        validate_rollout(rollout, self.config)
        result = self._new_result(rollout.policy_version)
        for name, values in rollout.float_fields().items():
            if not np.isfinite(values).all():
                result.skipped = True
                result.skip_reason = f"non-finite values in {name}; Step not applied"
                return result

        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), self.on_device():
            started = time.perf_counter()
            on_device, truncated_rows = self._upload(rollout)
            self._apply_step(on_device, truncated_rows, self._no_guard, result, started)
        return result

    def _upload(self, rollout: Rollout) -> tuple[DeviceRollout, np.ndarray]:
        """A checked host rollout on the device, with the flat indices of its truncated steps
        (the host knows them: the value pass need only cover those final observations)."""
        dev, dtype = self._device, self.dtype
        on_device = DeviceRollout(
            obs=dev(rollout.obs.astype(dtype)),
            next_obs=dev(next_observations(rollout, dtype)),
            actions=dev(rollout.actions.astype(np.int32)),
            rewards=dev(rollout.rewards.astype(dtype)),
            terminated=dev(rollout.terminated.astype(bool)),
            truncated=dev(rollout.truncated.astype(bool)),
            behavior_log_probs=dev(rollout.behavior_log_probs.astype(dtype)),
            bce_labels=None if rollout.bce_labels is None else dev(rollout.bce_labels),
            aux_targets=None if rollout.aux_targets is None else dev(rollout.aux_targets),
        )
        return on_device, dev(np.flatnonzero(rollout.truncated.reshape(-1)))

    def step_on_device(
        self, rollout: DeviceRollout, report: np.ndarray | None = None
    ) -> tuple[StepResult, np.ndarray]:
        """Apply one Step to a rollout already on the device, reading the device only once:
        the Step's statistics, together with `report` (a float device vector the caller wants
        back, e.g. its rollout statistics), which comes back as a host array. A non-finite
        value or an out-of-range action skips the Step whole (`result.skipped`), found on the
        device. Raises InvalidInput (changing nothing) on a wrong shape or dtype."""
        validate_device_rollout(rollout, self.config)
        result = self._new_result(rollout.policy_version)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), self.on_device():
            started = time.perf_counter()
            guard = self._rollout_guard(rollout)
            extra = self.xp.zeros(0) if report is None else report
            reported = self._apply_step(rollout, None, guard, result, started, extra)
        return result, reported

    def _new_result(self, policy_version: int | None) -> StepResult:
        result = StepResult(global_step=self.global_step)
        if policy_version is not None:
            result.policy_lag = self.global_step - policy_version
        return result

    def _rollout_guard(self, rollout: DeviceRollout) -> np.ndarray:
        """[1] on the device: 0, or NaN if some value is non-finite or some action is out of
        range (the updates' finite check then applies none of them)."""
        xp, A = self.xp, self.config.model.num_actions
        bad = ((rollout.actions < 0) | (rollout.actions >= A)).any()
        for values in rollout.float_fields().values():
            bad = bad | ~xp.isfinite(values).all()
        return xp.where(bad, np.nan, 0.0).astype(self.dtype).reshape(1)

    def _apply_step(
        self,
        rollout: DeviceRollout,
        truncated_rows: np.ndarray | None,
        guard: np.ndarray,
        result: StepResult,
        started: float,
        report: np.ndarray | None = None,
    ) -> np.ndarray:
        """The Step on device arrays; fills `result`, returns `report` read back."""
        xp, c51, gamma = self.xp, self.config.c51, self.config.train.gamma
        A = self.config.model.num_actions
        actions = xp.clip(rollout.actions, 0, A - 1).astype(np.int32)  # safe to index with
        batch, next_obs, return_stats = self._prepare(rollout, actions, truncated_rows, guard)
        transitions = nstep_transitions(rollout, next_obs, c51.n_step, gamma, self.dtype)
        transitions = replace(transitions, actions=actions.reshape(-1))
        # A host-checked rollout (the zero guard) needs no masked insert: its rows are valid.
        before = self.replay.insert(transitions, None if guard is self._no_guard else guard == 0)
        prepared = time.perf_counter()  # "prepare": values, GAE and the replay insert

        order, bounds = self._minibatch_plan(batch.actions.shape[0])
        use_q = len(self.replay) >= self.config.replay.min_size
        totals = self._run_updates(batch, order, bounds, use_q)
        self.value_norm.commit(return_stats, totals[APPLIED : APPLIED + 1] > 0)
        extra = xp.zeros(0) if report is None else report
        # [statistics, guard, return statistics, the caller's report]
        readback = xp.empty(REPORT + extra.size, dtype=np.float64)
        readback[:STATS_SIZE] = totals
        readback[GUARD] = guard[0]
        readback[GUARD + 1 : REPORT] = self.value_norm.stats
        readback[REPORT:] = extra
        host = self.backend.to_host(readback)  # the Step's one device read
        self.counters["updates_attempted"] += len(bounds)
        if np.isfinite(host[GUARD]):
            self._summarize(host[:STATS_SIZE], batch, use_q, result, host[GUARD + 1 : REPORT])
        else:
            self.replay.undo(before)
            result.updates_skipped = len(bounds)
            result.skipped = True
            result.skip_reason = "non-finite values or out-of-range actions; Step not applied"
        if result.updates_applied:
            self.counters["global_step"] += 1
        result.global_step = self.global_step
        finished = time.perf_counter()
        result.timings_ms = {
            "prepare": 1e3 * (prepared - started),
            "update": 1e3 * (finished - prepared),
            "total": 1e3 * (finished - started),
        }
        return host[REPORT:]

    def _minibatch_plan(self, rows: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The Step's minibatches: each epoch's seeded permutation of the rows (drawn on the
        backend's device), concatenated (int32 [epochs · rows]), and each update's
        [start, stop) in it."""
        ppo = self.config.ppo
        first = int(self.counters["updates_attempted"][0])
        order = self.xp.empty(ppo.epochs * rows, dtype=np.int32)
        bounds: list[tuple[int, int]] = []
        for epoch in range(ppo.epochs):
            sequence = first + len(bounds)  # the updates_attempted count at the epoch start
            order[epoch * rows : (epoch + 1) * rows] = self.ops.minibatch_order(
                self.key_on_device, sequence, rows
            )
            parts = np.array_split(np.arange(rows), min(ppo.num_minibatches, rows))
            bounds += [(epoch * rows + p[0], epoch * rows + p[-1] + 1) for p in parts]
        return order, [(int(a), int(b)) for a, b in bounds]

    def _run_updates(
        self, batch: Batch, order: np.ndarray, bounds: list[tuple[int, int]], use_q: bool
    ) -> np.ndarray:
        """Queue the Step's updates; returns the device statistics vector (STATS_SIZE)."""
        xp = self.xp
        self.sequences["updates_attempted"].fill(int(self.counters["updates_attempted"][0]))
        if self.graphs is None:
            totals = xp.empty(STATS_SIZE, dtype=np.float64)
            self._updates(batch, order, bounds, use_q, totals)
            return totals
        key = self._step_key(order, bounds, batch, use_q)
        if key not in self._static:  # the buffers this shape's graph reads
            static = Batch(*(None if a is None else xp.empty_like(a) for a in batch_arrays(batch)))
            self._static[key] = (static, xp.empty_like(order), xp.empty(STATS_SIZE))
        static, static_order, totals = self._static[key]
        for dst, src in zip(batch_arrays(static), batch_arrays(batch), strict=True):
            if dst is not None:
                dst[...] = src
        static_order[...] = order
        self.graphs.run(key, lambda: self._updates(static, static_order, bounds, use_q, totals))
        return totals

    @staticmethod
    def _step_key(
        order: np.ndarray, bounds: list[tuple[int, int]], batch: Batch, use_q: bool
    ) -> tuple:
        """What fixes a Step graph's shape: rows, minibatches, and the heads it trains."""
        return ("step", order.size, tuple(bounds), *_present(batch, use_q).values())

    def _updates(
        self,
        batch: Batch,
        order: np.ndarray,
        bounds: list[tuple[int, int]],
        use_q: bool,
        totals: np.ndarray,
    ) -> None:
        """The device work of a Step's updates: what a CUDA graph captures."""
        for k, (start, stop) in enumerate(bounds):
            self._update(batch, order[start:stop], use_q, totals, first=k == 0)

    def _summarize(
        self,
        totals: np.ndarray,
        batch: Batch,
        use_q: bool,
        result: StepResult,
        return_stats: np.ndarray,
    ) -> None:
        """Fill `result` from the read-back statistics vector (and return statistics)."""
        train = self.config.train
        result.updates_applied = int(totals[APPLIED])
        result.updates_skipped = int(totals[SKIPPED])
        result.skipped = result.updates_skipped > 0
        present = _present(batch, use_q)
        heads = [h for h in LOSS_HEADS if present[h]]
        if result.skipped:
            bad = [h for h in heads if totals[BAD + LOSS_HEADS.index(h)] > 0]
            where = f"loss of {', '.join(bad)}" if bad else "gradients"
            result.skip_reason = f"non-finite {where}; update not applied"
        if not result.updates_applied:
            return
        means = dict(zip(STATS, totals[: len(STATS)] / result.updates_applied, strict=True))
        result.losses = {h: float(means[f"loss_{h}"]) for h in heads}
        result.losses["total"] = sum(
            getattr(train, f"lambda_{h}") * result.losses[h] for h in heads
        )
        result.grad_norm = float(means["grad_norm"])
        result.entropy = float(means["entropy"])
        result.approx_kl = float(means["approx_kl"])
        result.clip_fraction = float(means["clip_fraction"])
        if use_q:
            result.c51_support_clip_ratio = float(means["c51_support_clip_ratio"])
            returns = (lambda: moments(return_stats)) if self.value_norm.enabled else None
            warning = self.support_watch.observe(
                self.global_step, result.c51_support_clip_ratio, returns
            )
            result.warnings += [warning] if warning else []

    def _prepare(
        self,
        rollout: DeviceRollout,
        actions: np.ndarray,
        truncated_rows: np.ndarray | None,
        guard: np.ndarray,
    ) -> tuple[Batch, np.ndarray, np.ndarray]:
        """Values of every observation, GAE, and the flat on-policy batch; also s_{t+1} as
        the dtype's [T, N, D] and the return statistics with this Step's returns folded in.
        Truncated steps bootstrap from V of their final observation: the value pass covers
        the `truncated_rows` (flat t·N + n) of next_obs, or all of them when the host does
        not know which (None)."""
        T, N, D = rollout.horizon, rollout.num_envs, self.config.model.obs_dim
        xp, dtype = self.xp, self.dtype
        obs = rollout.obs.astype(dtype, copy=False).reshape((T + 1) * N, D)
        next_obs = rollout.next_obs.astype(dtype, copy=False)
        flat_next = next_obs.reshape(T * N, D)
        final = flat_next if truncated_rows is None else flat_next[truncated_rows]
        values = self.value_norm.denormalize(self._values(xp.concatenate([obs, final])))
        v_obs = values[: (T + 1) * N].reshape(T + 1, N)
        v_final = values[(T + 1) * N :]
        if truncated_rows is None:
            v_next = xp.where(rollout.truncated, v_final.reshape(T, N), v_obs[1:])
        else:
            v_next = v_obs[1:].reshape(-1).copy()
            v_next[truncated_rows] = v_final
        advantages, returns = self.ops.gae(
            rollout.rewards.astype(dtype, copy=False),
            xp.ascontiguousarray(v_obs[:T]),
            xp.ascontiguousarray(v_next.reshape(T, N)),
            rollout.terminated.astype(np.uint8),
            rollout.truncated.astype(np.uint8),
            self.hp["train.gamma"],
            self.hp["ppo.gae_lambda"],
        )
        # The value head learns V in units of the return statistics with these returns in.
        return_stats = self.value_norm.updated(returns)
        returns = self.value_norm.normalize(returns, return_stats)
        old_values = self.value_norm.normalize(xp.ascontiguousarray(v_obs[:T]), return_stats)
        K = self.config.model.aux_dim
        bce, aux = rollout.bce_labels, rollout.aux_targets
        batch = Batch(
            obs=obs[: T * N],
            actions=actions.reshape(-1),
            behavior_log_probs=rollout.behavior_log_probs.astype(dtype, copy=False).reshape(-1),
            advantages=advantages.reshape(-1),
            returns=returns.reshape(-1),
            old_values=old_values.reshape(-1),
            bce_labels=None if bce is None else bce.astype(dtype).reshape(-1),
            aux_targets=None if aux is None else aux.astype(dtype, copy=False).reshape(T * N, K),
            guard=guard,
        )
        return batch, next_obs, return_stats

    def _device(self, array: np.ndarray) -> np.ndarray:
        """A host array on the backend's device (the same array on NumPy)."""
        return self.xp.asarray(array)

    def _values(self, obs: np.ndarray) -> np.ndarray:
        depth = self.config.model.depth
        h = model.encoder_fwd(self.ops, self.params, obs, depth)[-1]
        return model.head_fwd(self.ops, self.params, "v", h)[:, 0]

    def _q_target(self, replay: Transitions) -> tuple[np.ndarray, tuple]:
        """The projected C51 target m [Bq, Z] for a replay batch, from the target network, and
        the projection's arguments (for `c51_support_clip_ratio`)."""
        cfg, ops, hp = self.config, self.ops, self.hp
        A, Z, depth = cfg.model.num_actions, cfg.c51.num_atoms, cfg.model.depth
        h_next = model.encoder_fwd(ops, self.target, replay.next_obs, depth)[-1]
        if cfg.c51.double_dqn:  # the online network picks a*, the target network scores it
            target_logits = model.head_fwd(ops, self.target, "q", h_next).reshape(-1, A, Z)
            h_online = model.encoder_fwd(ops, self.params, replay.next_obs, depth)[-1]
            online_z = ops.matmul(h_online, self.params["q/W"]).reshape(-1, A, Z)
            best, _ = ops.c51_greedy(online_z, self.params["q/b"], self.support)
            rows = self.xp.arange(best.shape[0]) * A + best  # one index array: a plain gather
            next_probs = ops.c51_softmax(target_logits).reshape(-1, Z)[rows]
        else:  # a* and its distribution in one pass over the target's logits (bias added there)
            target_z = ops.matmul(h_next, self.target["q/W"]).reshape(-1, A, Z)
            _, next_probs = ops.c51_greedy(target_z, self.target["q/b"], self.support)
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

    def _update(
        self, batch: Batch, rows: np.ndarray, use_q: bool, totals: np.ndarray, first: bool
    ) -> None:
        """One optimizer update on rollout rows `rows` (+ a replay batch when `use_q`), its
        statistics added to `totals` (which the Step's `first` update resets). Device work
        only: no host reads, no uploads."""
        cfg, ops, params, hp = self.config, self.ops, self.params, self.hp
        depth = cfg.model.depth
        sequence = self.sequences["updates_attempted"]
        replay = support_clip = None
        # Work nothing downstream waits for (weight gradients, a statistic) overlaps the rest
        # of the chain on a side lane, joined before the optimizer step. The functions (holding
        # the arrays they read) stay referenced until joined: a freed input could otherwise be
        # reused by the chain while they still read it.
        aside: list[tuple[object, Callable]] = []

        def beside(fn: Callable[[], T], lane: int = 0) -> T:
            result, token = self._fork(fn, lane)
            aside.append((token, fn))
            return result

        if use_q:
            slots = ops.replay_sample_indices(
                self.replay.size_on_device, self.key_on_device, sequence, cfg.replay.batch_size
            )
            replay = Transitions(**ops.replay_gather(self.replay.storage, slots))
            # The target network's forward and projection overlap the online network's work.
            (target, projection_args), target_ready = self._fork(lambda: self._q_target(replay))

        xp = self.xp
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
        (grad_h, pi_stats, head_grads), policy_ready = self._fork(
            lambda: self._on_policy_heads(minibatch, h[:on_policy], losses), lane=1
        )
        grads.update(beside(head_grads, lane=1))
        if replay is not None:
            h_q = h[on_policy:]
            self._join(target_ready)
            clip_ratio = lambda: ops.c51_support_clip_ratio(*projection_args)  # noqa: E731
            support_clip = beside(clip_ratio)
            # Only each row's taken action is computed: its logits, loss and gradients.
            losses["q"], grad_h_taken, grad_taken = ops.c51_taken_loss_bwd(
                h_q, params["q/W"], params["q/b"], replay.actions, target
            )
            A = cfg.model.num_actions
            q_params = lambda: ops.c51_taken_grad_params(h_q, replay.actions, grad_taken, A)  # noqa: E731
            grads["q/W"], grads["q/b"] = beside(q_params, lane=2)
        self._join(policy_ready)
        if replay is not None:
            grad_h = ops.grad_h_stack(grad_h, grad_h_taken, hp["train.lambda_q"])
        grads.update(model.encoder_bwd(ops, params, activations, grad_h, depth, beside))
        for token, _fn in aside:
            self._join(token)

        names = [name for name in params if name in grads]  # fixed parameter order
        norm, scales = self._clip_scales(names, grads)
        ok = ops.all_finite([*(xp.atleast_1d(v) for v in losses.values()), norm, batch.guard])
        self._apply(names, grads, scales, ok, use_q)
        ops.advance_counter(sequence, self._always)  # the next update's replay draw
        statistics = {f"loss_{head}": loss for head, loss in losses.items()}
        statistics.update(grad_norm=norm, c51_support_clip_ratio=support_clip)
        statistics.update({k: pi_stats[k] for k in ("entropy", "approx_kl", "clip_fraction")})
        ops.step_stats_accumulate(totals, [statistics.get(name) for name in STATS], ok, first)

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
        ops, params, hp, ppo = self.ops, self.params, self.hp, self.config.ppo
        heads = ["pi", "v"]
        if batch.bce_labels is not None:  # the perception heads train when labels came
            heads.append("bce")
        if batch.aux_targets is not None:
            heads.append("aux")
        Ws = [params[f"{head}/W"] for head in heads]
        bs = [params[f"{head}/b"] for head in heads]
        outputs = dict(zip(heads, ops.linear_heads_fwd(h_pol, Ws, bs), strict=True))
        grad_outputs: list[np.ndarray] = []

        # Policy head: PPO clipped surrogate + entropy bonus.
        advantages = batch.advantages
        if ppo.norm_adv:
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
        grad_outputs.append(grad_logits)

        # Value head: 0.5 (v - R)², optionally clipped around the rollout-time value.
        losses["v"], grad_v = ops.value_fwd_bwd(
            outputs["v"][:, 0],
            batch.returns,
            batch.old_values,
            hp["ppo.value_clip_eps"] if ppo.clip_value_loss else None,
        )
        grad_outputs.append(grad_v[:, None])

        # Perception heads.
        if "bce" in outputs:
            losses["bce"], grad_u = ops.bce_fwd_bwd(outputs["bce"][:, 0], batch.bce_labels)
            grad_outputs.append(grad_u[:, None])
        if "aux" in outputs:
            losses["aux"], grad_pred = ops.aux_mse_fwd_bwd(outputs["aux"], batch.aux_targets)
            grad_outputs.append(grad_pred)

        lambdas = hp.weights([f"train.lambda_{head}" for head in heads])
        grad_h = ops.linear_heads_bwd_input(Ws, grad_outputs, lambdas)

        def parameter_grads() -> dict[str, np.ndarray]:
            grad_Ws, grad_bs = ops.linear_heads_bwd_params(h_pol, grad_outputs)
            named = zip(heads, grad_Ws, grad_bs, strict=True)
            return {f"{head}/{kind}": g for head, W, b in named for kind, g in (("W", W), ("b", b))}

        return grad_h, pi_stats, parameter_grads

    def _clip_scales(
        self, names: list[str], grads: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The global gradient norm [1] and each tensor's clip coefficient [1]: of the global
        norm (`optim.clip_scope = "global"`), or of its optimizer group's own norm ("group":
        a spike in one head's gradient then shrinks that head's step alone)."""
        ops, max_norm = self.ops, self.hp["optim.max_grad_norm"]
        tensors = [grads[name] for name in names]
        if self.config.optim.clip_scope == "global":
            norm = ops.global_norm(tensors)
            return norm, [ops.clip_coefficient(norm, max_norm)] * len(names)
        owners = [model.group_of(name) for name in names]
        groups = list(dict.fromkeys(owners))  # names come group by group
        norms = ops.group_norms(tensors, [owners.count(group) for group in groups])
        coefficients = ops.clip_coefficient(norms[: len(groups)], max_norm)
        index = {group: j for j, group in enumerate(groups)}
        scales = [coefficients[index[g] : index[g] + 1] for g in owners]
        return norms[len(groups) :], scales

    def _apply(
        self,
        names: list[str],
        grads: dict[str, np.ndarray],
        scales: list[np.ndarray],
        ok: np.ndarray,
        use_q: bool,
    ) -> None:
        """Step each group's AdamW on the clipped gradients, refresh the target network."""
        ops, hp = self.ops, self.hp
        groups = {model.group_of(name): None for name in names}
        ops.advance_counters([self.optim_steps[group] for group in groups], ok)
        ops.adamw_steps(
            [self.params[name] for name in names],
            [grads[name] for name in names],
            [self.exp_avg[name] for name in names],
            [self.exp_avg_sq[name] for name in names],
            [self.optim_steps[model.group_of(name)] for name in names],
            hp["optim.lr"],
            hp["optim.beta1"],
            hp["optim.beta2"],
            hp["optim.eps"],
            [hp["optim.weight_decay"] if model.is_weight_matrix(n) else hp[ZERO] for n in names],
            scales,
            ok,
        )
        if use_q:  # the target tracks the Q head's updates
            target_names = list(self.target)
            ops.target_refresh(
                [self.target[name] for name in target_names],
                [self.params[name] for name in target_names],
                self.optim_steps["q"],
                self.config.c51.target_update_period,
                hp["c51.target_tau"],
                ok,
            )

    # ------------------------------------------------------------------------------ Act
    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        """Actions for observations [N, D]; each call draws fresh Philox counters."""
        D = self.config.model.obs_dim
        if not isinstance(obs, np.ndarray) or obs.ndim != 2 or obs.shape[1] != D:
            got = list(obs.shape) if isinstance(obs, np.ndarray) else type(obs).__name__
            raise InvalidInput("obs", f"an array of shape [N, {D}]", got)
        if obs.dtype.kind != "f" or not np.isfinite(obs).all():
            raise InvalidInput("obs", "finite floating-point values", f"dtype {obs.dtype}")
        if not isinstance(mode, ActMode):
            raise InvalidInput("mode", f"one of {[m.name for m in ActMode]}", mode)
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput("epsilon", "a probability in [0, 1]", epsilon)
        with self.on_device():
            outputs = self._act_outputs(self._device(obs.astype(self.dtype)), mode, epsilon)
            actions, log_probs, values = (self.backend.to_host(a) for a in outputs)
        return ActResult(
            actions=actions,
            log_probs=log_probs,
            values=values,
            policy_version=self.global_step,
        )

    def act_on_device(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> tuple:
        """Act on observations already on the device [N, D], reading nothing back: the
        (actions int32, log π(a|s), V(s)) [N] device arrays, valid until the next Act of the
        same shape (a captured graph's outputs). The caller enqueues its next work on the
        trainer's stream (`on_device`). Only the shape and dtype are checked."""
        D = self.config.model.obs_dim
        if getattr(obs, "shape", None) is None or obs.ndim != 2 or obs.shape[1] != D:
            raise InvalidInput("obs", f"an array of shape [N, {D}]", getattr(obs, "shape", obs))
        if obs.dtype != self.dtype:
            raise InvalidInput("obs", f"dtype {self.dtype}", f"dtype {obs.dtype}")
        if not isinstance(mode, ActMode):
            raise InvalidInput("mode", f"one of {[m.name for m in ActMode]}", mode)
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput("epsilon", "a probability in [0, 1]", epsilon)
        with self.on_device():
            return self._act_outputs(obs, mode, epsilon)

    def _act_outputs(self, x: np.ndarray, mode: ActMode, epsilon: float) -> tuple:
        """Act's device work on device observations; advances the act counter."""
        self.sequences["act_calls"].fill(int(self.counters["act_calls"][0]))
        if self.graphs is None:
            outputs = self._act_device(x, mode, epsilon)
        else:
            key = ("act", x.shape[0], mode)
            if key not in self._static:
                self._static[key] = (self.xp.empty(x.shape, self.dtype), self.xp.empty(1))
            static_obs, static_epsilon = self._static[key]
            static_obs[...] = x
            static_epsilon.fill(float(epsilon))
            outputs = self.graphs.run(
                key, lambda: self._act_device(static_obs, mode, static_epsilon)
            )
        self.counters["act_calls"] += 1
        return outputs

    def _act_device(self, x: np.ndarray, mode: ActMode, epsilon) -> tuple:
        """Act's device work: forwards and the action choice (what an Act graph captures)."""
        ops, cfg = self.ops, self.config
        h = model.encoder_fwd(ops, self.params, x, cfg.model.depth)[-1]
        logits = model.head_fwd(ops, self.params, "pi", h)
        values = self.value_norm.denormalize(model.head_fwd(ops, self.params, "v", h)[:, 0])
        q_values = None
        if mode in (ActMode.GREEDY_Q, ActMode.EPSILON_GREEDY):
            A, Z = cfg.model.num_actions, cfg.c51.num_atoms
            probs = model.q_distribution(ops, self.params, h, A, Z)
            q_values = ops.c51_q_values(probs, self.support)
        actions, log_probs = ops.act_select(
            logits, q_values, mode, epsilon, self.key_on_device, self.sequences["act_calls"]
        )
        return actions, log_probs, values

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
        with self.on_device():
            self.hp.refresh(self.config)  # in place: a captured graph reads the new values
        self.synchronize()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every array that defines the trainer, by name `group/...` with groups params, target,
        optim, replay, counters and rng (the seed; with the counters it fixes every future draw).
        """
        host = self.backend.to_host
        with self.on_device():
            return {name: host(array) for name, array in self._state_arrays().items()}

    def _state_arrays(self) -> dict[str, np.ndarray]:
        """`state_dict()`'s arrays where they live (on the device for a GPU backend)."""
        state: dict[str, np.ndarray] = {}
        state.update({f"params/{k}": v for k, v in self._policy_arrays().items()})
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
        self.config = config
        self.key = seed_key(seed)
        with self.on_device():
            for name, array in self._state_targets().items():
                self._assign(array, state[name])
            self._assign(self.key_on_device, np.array(self.key, dtype=np.uint32))
            self.replay.load_state(
                {k.removeprefix("replay/"): v for k, v in state.items() if k.startswith("replay/")}
            )
        self.synchronize()

    def _policy_arrays(self) -> dict[str, np.ndarray]:
        """What Act reads: the online parameters and the value head's return statistics."""
        return {**self.params, VALUE_NORM: self.value_norm.stats}

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replace what Act reads only (an inference-only server's restore): the online
        parameters and the return statistics, the checkpoint's `params` group."""
        policy = self._policy_arrays()
        for name, current in policy.items():
            incoming = params.get(name)
            if (
                incoming is None
                or incoming.dtype != current.dtype
                or incoming.shape != current.shape
            ):
                got = "nothing" if incoming is None else f"{incoming.dtype}{list(incoming.shape)}"
                raise InvalidInput(f"params/{name}", f"{current.dtype}{list(current.shape)}", got)
        unknown = sorted(set(params) - set(policy))
        if unknown:
            raise InvalidInput("params", "exactly this model's tensors", f"unknown {unknown[:5]}")
        with self.on_device():
            for name, array in policy.items():
                self._assign(array, params[name])
        self.synchronize()

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
