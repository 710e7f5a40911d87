"""The Step pipeline: GAE, PPO epochs × minibatches, C51 on replay, AdamW.

A Step checks its rollout, puts it on the device, computes the values of every observation,
GAE and the return statistics, inserts its n-step transitions into the replay, draws each
epoch's minibatch order, queues the updates (`update.Updates`) and reads the device back once:
the statistics it summarises into a StepResult, and whatever the caller asked for.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from service.backend.executor import Executor
from service.backend.philox import Stream, random_bits
from service.trainer import model
from service.trainer.rollout import (
    nstep_transitions,
    validate_device_rollout,
    validate_rollout,
)
from service.trainer.state import State
from service.trainer.support_watch import SupportWatch
from service.trainer.update import (
    APPLIED,
    BAD,
    LOSS_HEADS,
    SKIPPED,
    STATS,
    STATS_SIZE,
    Batch,
    Updates,
    present,
)
from service.trainer.value_norm import moments
from service.types import FLOAT_FIELDS, DeviceRollout, Rollout, StepResult

# The Step's readback: the statistics, the rollout guard, the value head's return statistics
# (3), then what the caller asked for.
GUARD, REPORT = STATS_SIZE, STATS_SIZE + 4


def split_bounds(rows: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of `parts` consecutive runs of `rows` rows, as np.array_split cuts them:
    the first rows % parts runs one row longer."""
    size, longer = divmod(rows, parts)
    stops = [(k + 1) * size + min(k + 1, longer) for k in range(parts)]
    return list(zip([0, *stops[:-1]], stops, strict=True))


class Learner:
    """Applies Steps to the parameters of `state`; `updates` holds their device work."""

    def __init__(self, state: State, executor: Executor) -> None:
        self.state = state
        self.updates = Updates(state, executor)
        self.support_watch = SupportWatch(state.config.c51)

    def step(self, rollout: Rollout, finite: bool = False) -> StepResult:
        """Apply one Step. Raises InvalidInput (changing nothing) on malformed input. A
        non-finite float skips the Step whole (`result.skipped`); with `finite` the caller
        vouches for every float (the server checks each as it decodes it), which spares a scan
        of the whole rollout, most of this method's own time in a served Step's profile
        (bench/served_step.py)."""
        validate_rollout(rollout, self.state.config)
        result = self._new_result(rollout.policy_version)
        values = {} if finite else rollout.float_fields()
        bad = [name for name in FLOAT_FIELDS
               if name in values and not np.isfinite(values[name]).all()]  # fmt: skip
        state = self.state
        if state.sharding.parallel:  # every rank skips if one does: none waits alone
            flags = state.xp.asarray(np.array([float(name in bad) for name in FLOAT_FIELDS]))
            state.sharding.comm.all_reduce_sum(flags)
            summed = state.backend.to_host(flags)
            bad = [name for name, flag in zip(FLOAT_FIELDS, summed, strict=True) if flag > 0]
        if bad:
            result.skipped = True
            result.skip_reason = f"non-finite values in {bad[0]}; Step not applied"
            return result

        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            started = time.perf_counter()
            on_device, truncated_rows = self._upload(rollout)
            self._apply_step(on_device, truncated_rows, self.state.no_guard, result, started)
        return result

    def batch(self, rollout: Rollout) -> Batch:
        """The on-policy batch a Step on `rollout` (valid, finite) would train on, under the
        parameters and return statistics as they are; changes nothing (bench/cpu_step.py
        times updates on it)."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            on_device, truncated_rows = self._upload(rollout)
            guard = self.state.no_guard
            return self._prepare(on_device, on_device.actions, truncated_rows, guard)[0]

    def _upload(self, rollout: Rollout) -> tuple[DeviceRollout, np.ndarray]:
        """A checked host rollout on the device, with the flat indices of its truncated steps
        (the host knows them: the value pass need only cover those final observations).
        s_{t+1} is built on the device: obs[t+1], or the final observation at truncation."""
        state = self.state
        dtype, xp = state.dtype, state.xp
        upload = state.backend.to_device
        T, N = rollout.horizon, rollout.num_envs
        obs = upload(rollout.obs.astype(dtype, copy=False))
        next_obs = xp.empty((T * N, obs.shape[2]), dtype=dtype)
        next_obs[...] = obs[1:].reshape(T * N, -1)
        if rollout.final_obs is not None and rollout.final_obs.size:
            index = upload(rollout.final_obs_index.astype(np.int64, copy=False))
            next_obs[index] = upload(rollout.final_obs.astype(dtype, copy=False))
        labels = {"bce_labels": rollout.bce_labels, "aux_targets": rollout.aux_targets}
        on_device = DeviceRollout(
            obs=obs,
            next_obs=next_obs.reshape(T, N, -1),
            actions=upload(rollout.actions.astype(np.int32, copy=False)),
            rewards=upload(rollout.rewards.astype(dtype, copy=False)),
            terminated=upload(rollout.terminated.astype(bool, copy=False)),
            truncated=upload(rollout.truncated.astype(bool, copy=False)),
            behavior_log_probs=upload(rollout.behavior_log_probs.astype(dtype, copy=False)),
            **{name: None if a is None else upload(a) for name, a in labels.items()},
        )
        return on_device, upload(np.flatnonzero(rollout.truncated.reshape(-1)))

    def step_on_device(
        self, rollout: DeviceRollout, report: np.ndarray | None = None
    ) -> tuple[StepResult, np.ndarray]:
        """Apply one Step to a rollout already on the device, reading the device only once:
        the Step's statistics, together with `report` (a float device vector the caller wants
        back, e.g. its rollout statistics), which comes back as a host array. A non-finite
        value or an out-of-range action skips the Step whole (`result.skipped`), found on the
        device. Raises InvalidInput (changing nothing) on a wrong shape or dtype."""
        validate_device_rollout(rollout, self.state.config)
        result = self._new_result(rollout.policy_version)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            started = time.perf_counter()
            guard = self._rollout_guard(rollout)
            extra = self.state.xp.zeros(0) if report is None else report
            reported = self._apply_step(rollout, None, guard, result, started, extra)
        return result, reported

    def _new_result(self, policy_version: int | None) -> StepResult:
        result = StepResult(global_step=self.state.global_step)
        if policy_version is not None:
            result.policy_lag = self.state.global_step - policy_version
        return result

    def _rollout_guard(self, rollout: DeviceRollout) -> np.ndarray:
        """[1] on the device: 0, or NaN if some value is non-finite or some action is out of
        range (the updates' finite check then applies none of them)."""
        xp, A = self.state.xp, self.state.config.model.num_actions
        bad = ((rollout.actions < 0) | (rollout.actions >= A)).any()
        for values in rollout.float_fields().values():
            bad = bad | ~xp.isfinite(values).all()
        return xp.where(bad, np.nan, 0.0).astype(self.state.dtype).reshape(1)

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
        state = self.state
        xp, config = state.xp, state.config
        state.hp.at_step(state.global_step)  # the kickstart weight of this Step
        c51, gamma = config.c51, config.train.gamma
        A = config.model.num_actions
        actions = xp.clip(rollout.actions, 0, A - 1).astype(np.int32)  # safe to index with
        batch, next_obs, return_stats = self._prepare(rollout, actions, truncated_rows, guard)
        transitions = nstep_transitions(rollout, next_obs, c51.n_step, gamma, state.dtype, xp)
        transitions = replace(transitions, actions=actions.reshape(-1))
        # A host-checked rollout (the zero guard) needs no masked insert: its rows are valid.
        valid = None if guard is state.no_guard else guard == 0
        before = state.replay.insert(transitions, valid, columns=rollout.num_envs)
        prepared = time.perf_counter()  # "prepare": values, GAE and the replay insert

        order, bounds = self._minibatch_plan(rollout.horizon, rollout.num_envs)
        # Every shard's ring holds as many rows: the whole replay's size, on every rank.
        use_q = int(state.replay.size[0]) * state.sharding.shards >= config.replay.min_size
        totals = self.updates.run(batch, order, bounds, use_q)
        state.value_norm.commit(return_stats, totals[APPLIED : APPLIED + 1] > 0)
        extra = xp.zeros(0) if report is None else report
        # [statistics, guard, return statistics, the caller's report]
        readback = xp.empty(REPORT + extra.size, dtype=np.float64)
        readback[:STATS_SIZE] = totals
        readback[GUARD] = guard[0]
        readback[GUARD + 1 : REPORT] = state.value_norm.stats
        readback[REPORT:] = extra
        host = state.backend.to_host(readback)  # the Step's one device read
        state.counters["updates_attempted"] += len(bounds)
        if np.isfinite(host[GUARD]):
            self._summarize(host[:STATS_SIZE], batch, use_q, result, host[GUARD + 1 : REPORT])
        else:
            state.replay.undo(before)
            result.updates_skipped = len(bounds)
            result.skipped = True
            result.skip_reason = "non-finite values or out-of-range actions; Step not applied"
        if result.updates_applied:
            state.counters["global_step"] += 1
        result.global_step = state.global_step
        finished = time.perf_counter()
        result.timings_ms = {
            "prepare": 1e3 * (prepared - started),
            "update": 1e3 * (finished - prepared),
            "total": 1e3 * (finished - started),
        }
        return host[REPORT:]

    def _minibatch_plan(
        self, horizon: int, columns: int
    ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The Step's minibatches: each epoch's seeded permutation of the rows (drawn on the
        backend's device), concatenated (int32 [epochs · rows]), and each update's
        [start, stop) in it. With data shards, each shard's rows are ordered apart (by the
        Philox keys of their rows in the whole Step) and minibatch k joins every held shard's
        k-th part, so a rank's minibatch is its shards' share of the whole Step's."""
        state, ppo = self.state, self.state.config.ppo
        if state.sharding.shards > 1:
            return self._sharded_plan(horizon, columns)
        rows = horizon * columns
        first = int(state.counters["updates_attempted"][0])
        order = state.xp.empty(ppo.epochs * rows, dtype=np.int32)
        bounds: list[tuple[int, int]] = []
        for epoch in range(ppo.epochs):
            sequence = first + len(bounds)  # the updates_attempted count at the epoch start
            order[epoch * rows : (epoch + 1) * rows] = state.backend.ops.minibatch_order(
                state.key_on_device, sequence, rows
            )
            bounds += [(epoch * rows + a, epoch * rows + b)
                       for a, b in split_bounds(rows, min(ppo.num_minibatches, rows))]  # fmt: skip
        return order, bounds

    def _sharded_plan(self, horizon: int, columns: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        state, ppo, sharding = self.state, self.state.config.ppo, self.state.sharding
        N = sharding.global_columns(columns)
        block = N // sharding.shards
        t, c = np.divmod(np.arange(horizon * block), block)
        local = [t * columns + j * block + c for j in range(len(sharding.owned))]
        whole = [t * N + s * block + c for s in sharding.owned]
        first = int(state.counters["updates_attempted"][0])
        parts = np.array_split(np.arange(horizon * block), min(ppo.num_minibatches, t.size))
        order: list[np.ndarray] = []
        bounds: list[tuple[int, int]] = []
        for _ in range(ppo.epochs):
            sequence = first + len(bounds)  # the updates_attempted count at the epoch start
            keys = random_bits(state.key, Stream.MINIBATCH, sequence, horizon * N)[:, 0]
            shard_orders = [rows[np.argsort(keys[w], kind="stable")]
                            for rows, w in zip(local, whole, strict=True)]  # fmt: skip
            for part in parts:
                start = sum(len(o) for o in order)
                order.append(np.concatenate([o[part] for o in shard_orders]))
                bounds.append((start, start + len(order[-1])))
        return state.xp.asarray(np.concatenate(order).astype(np.int32)), bounds

    def _summarize(
        self,
        totals: np.ndarray,
        batch: Batch,
        use_q: bool,
        result: StepResult,
        return_stats: np.ndarray,
    ) -> None:
        """Fill `result` from the read-back statistics vector (and return statistics)."""
        train = self.state.config.train
        result.updates_applied = int(totals[APPLIED])
        result.updates_skipped = int(totals[SKIPPED])
        result.skipped = result.updates_skipped > 0
        flags = present(batch, use_q)
        heads = [h for h in LOSS_HEADS if flags[h]]
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
            enabled = self.state.value_norm.enabled
            returns = (lambda: moments(return_stats)) if enabled else None
            warning = self.support_watch.observe(
                self.state.global_step, result.c51_support_clip_ratio, returns
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
        state = self.state
        T, N, D = rollout.horizon, rollout.num_envs, state.config.model.obs_dim
        xp, dtype, value_norm = state.xp, state.dtype, state.value_norm
        obs = rollout.obs.astype(dtype, copy=False).reshape((T + 1) * N, D)
        next_obs = rollout.next_obs.astype(dtype, copy=False)
        flat_next = next_obs.reshape(T * N, D)
        final = flat_next if truncated_rows is None else flat_next[truncated_rows]
        values = value_norm.denormalize(self._values(xp.concatenate([obs, final])))
        v_obs = values[: (T + 1) * N].reshape(T + 1, N)
        v_final = values[(T + 1) * N :]
        if truncated_rows is None:
            v_next = xp.where(rollout.truncated, v_final.reshape(T, N), v_obs[1:])
        else:
            v_next = v_obs[1:].reshape(-1).copy()
            v_next[truncated_rows] = v_final
        advantages, returns = state.backend.ops.gae(
            rollout.rewards.astype(dtype, copy=False),
            xp.ascontiguousarray(v_obs[:T]),
            xp.ascontiguousarray(v_next.reshape(T, N)),
            rollout.terminated.astype(np.uint8),
            rollout.truncated.astype(np.uint8),
            state.hp["train.gamma"],
            state.hp["ppo.gae_lambda"],
        )
        # The value head learns V in units of the return statistics with these returns in
        # (of the whole Step's returns: summed over the ranks).
        sharding = state.sharding
        return_stats = value_norm.updated(returns, sharding.comm if sharding.parallel else None)
        returns = value_norm.normalize(returns, return_stats)
        old_values = value_norm.normalize(xp.ascontiguousarray(v_obs[:T]), return_stats)
        K = state.config.model.aux_dim
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

    def _values(self, obs: np.ndarray) -> np.ndarray:
        """V's network output (normalised units) for observations [B, D]."""
        state = self.state
        h = model.encoder_fwd(state.backend.ops, state.params, obs, state.config.model.depth)[-1]
        return model.head_fwd(state.backend.ops, state.params, "v", h)[:, 0]
