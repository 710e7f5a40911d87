"""Rollouts assembled from an actor's env steps, group by group (Interact; SEED RL's design).

The server's Interact handler builds the rollouts it trains on with an `Unroller`; the actor
runs its own over the same requests and answers, so it holds the very rollout the server
assembled and can send it again as a unary Step when the stream breaks.

An actor's environments act in groups (one group steps while another's actions are in flight).
Per request a group sends its observations with the outcome of its previous actions; the
`Unroller` writes both into the stream's rollout buffer, in the group's columns, and the
server's answer (actions, log-probs, policy version) into the same rows. The observation a
group sends at its T-th step closes its part of rollout k (row T, the bootstrap) and opens its
part of rollout k + 1 (row 0); rollout k is complete when every group has closed it, and is
then trained on as the keyed Step (actor_id, first_sequence + k). A group may run at most one
rollout ahead of the slowest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import InvalidInput
from service.types import Rollout

Allocate = Callable[[tuple[int, ...], Any], np.ndarray]  # np.empty's (shape, dtype)


@dataclass(frozen=True)
class GroupStep:
    """One request of one group, decoded and checked: its observations now and, from its second
    request on, the outcome of its previous actions."""

    obs: np.ndarray  # [n, D] float32
    rewards: np.ndarray | None = None  # [n] float32; None on the group's first request
    terminated: np.ndarray | None = None  # [n] bool
    truncated: np.ndarray | None = None  # [n] bool
    final_obs: np.ndarray | None = None  # [M, D] float32
    final_obs_index: np.ndarray | None = None  # [M]: environments of the group
    bce_labels: np.ndarray | None = None  # [n] uint8
    aux_targets: np.ndarray | None = None  # [n, K] float32


@dataclass
class _Buffer:
    """Rollout k of the stream, filled column group by column group."""

    obs: np.ndarray  # [T + 1, N, D]
    actions: np.ndarray  # [T, N]
    log_probs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    bce_labels: np.ndarray | None
    aux_targets: np.ndarray | None
    final_obs: list[np.ndarray] = field(default_factory=list)
    final_index: list[np.ndarray] = field(default_factory=list)
    version: int | None = None  # the oldest policy version that acted in it
    closed: int = 0  # groups that sent its bootstrap row

    @classmethod
    def empty(cls, T: int, N: int, D: int, empty: Allocate) -> _Buffer:
        """Unlabelled buffers; `add_labels` sizes the label arrays the stream's outcomes carry."""
        return cls(
            obs=empty((T + 1, N, D), np.float32),
            actions=empty((T, N), np.int32),
            log_probs=empty((T, N), np.float32),
            rewards=empty((T, N), np.float32),
            terminated=empty((T, N), bool),
            truncated=empty((T, N), bool),
            bce_labels=None,
            aux_targets=None,
        )

    def add_labels(self, T: int, N: int, labels: bool, K: int | None, empty: Allocate) -> None:
        if labels:
            self.bce_labels = empty((T, N), np.uint8)
        if K is not None:
            self.aux_targets = empty((T, N, K), np.float32)

    def rollout(self) -> Rollout:
        none = not self.final_obs
        return Rollout(
            obs=self.obs,
            actions=self.actions,
            rewards=self.rewards,
            terminated=self.terminated,
            truncated=self.truncated,
            behavior_log_probs=self.log_probs,
            final_obs=np.zeros((0, self.obs.shape[2]), np.float32) if none
            else np.concatenate(self.final_obs),
            final_obs_index=np.zeros(0, np.int64) if none else np.concatenate(self.final_index),
            policy_version=self.version,
            bce_labels=self.bce_labels,
            aux_targets=self.aux_targets,
        )


def rollout_bytes(T: int, N: int, D: int, K: int) -> int:
    """The bytes of one rollout buffer [T, N] of D features, labelled (BCE and K aux targets):
    what a stream declaring it allocates per rollout (`_Buffer`), in Python ints (no overflow).
    obs [T + 1, N, D] f32; actions, log-probs, rewards [T, N] 4 bytes each; terminated,
    truncated, BCE labels [T, N] 1 byte each; aux targets [T, N, K] f32."""
    return 4 * (T + 1) * N * D + T * N * (3 * 4 + 3 * 1 + 4 * K)


class Unroller:
    """One Interact stream's rollouts [T, N] from its groups' requests.

    A completed rollout's arrays are its buffer's. With `recycling`, `recycle(k)` hands rollout
    k's buffer back for a later rollout once nothing reads it (the server, after its Step), so
    a stream writes into the same few buffers instead of fresh pages (3.8 MB a rollout at 512
    LobSim markets); without (the actor, which keeps its rollouts) every rollout has its own.
    `empty` allocates the buffers' arrays: the server's trainer gives host memory it uploads
    from without a staging copy (pinned, on CUDA).
    """

    def __init__(
        self,
        rollout_len: int,
        group_envs: list[int],
        obs_dim: int,
        recycling: bool = False,
        empty: Allocate = np.empty,
    ) -> None:
        self.T, self.D, self.recycling, self.empty = rollout_len, obs_dim, recycling, empty
        self.sizes = list(group_envs)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).tolist()
        self.N = self.starts[-1]
        self._rollout = [0] * len(self.sizes)  # per group: the rollout it is filling
        self._row = [-1] * len(self.sizes)  # per group: its current row (-1: no request yet)
        self._buffers: dict[int, _Buffer] = {}
        self._completed: dict[int, _Buffer] = {}  # handed out, not yet recycled
        self._spare: list[_Buffer] = []
        self._labels: bool | None = None  # whether outcomes carry BCE labels (the first says)
        self._aux_dim: int | None = None
        self._shaped = False

    @property
    def env_steps_pending(self) -> int:
        """Transitions received for rollouts not yet complete (lost if the stream ends)."""
        oldest = min(self._rollout)
        return sum(
            n * (max(row, 0) + self.T * (k - oldest))
            for n, row, k in zip(self.sizes, self._row, self._rollout, strict=True)
        )

    def observe(self, group: int, step: GroupStep) -> list[tuple[int, Rollout]]:
        """Record `group`'s outcome and new observations; the rollouts this completed, as
        (k, rollout). Raises InvalidInput (changing nothing) when the request does not fit."""
        if not 0 <= group < len(self.sizes):
            raise InvalidInput("group", f"a group in [0, {len(self.sizes)})", group)
        n, lo = self.sizes[group], self.starts[group]
        cols = slice(lo, lo + n)
        first = self._row[group] < 0
        if step.obs.shape != (n, self.D):
            raise InvalidInput("obs", f"shape [{n}, {self.D}] (group {group})",
                               list(step.obs.shape))  # fmt: skip
        if first != (step.rewards is None):
            raise InvalidInput(
                "rewards",
                "none on a group's first request, then the outcome of its actions on every one",
                "none" if step.rewards is None else "an outcome on a first request",
            )
        k, t = self._rollout[group], self._row[group]
        if not first:
            if t + 1 == self.T and k + 1 - min(self._rollout) >= 2:
                raise InvalidInput(
                    "group", f"a group at most one rollout ahead of the others (group {group} "
                    "would start a second rollout before every group closed the first)", group)
            self._check_outcome(step)
        buffer = self._buffer(k)
        if first:
            buffer.obs[0, cols] = step.obs
            self._row[group] = 0
            return []
        buffer.rewards[t, cols] = step.rewards
        buffer.terminated[t, cols] = step.terminated
        buffer.truncated[t, cols] = step.truncated
        if buffer.bce_labels is not None:
            buffer.bce_labels[t, cols] = step.bce_labels
        if buffer.aux_targets is not None:
            buffer.aux_targets[t, cols] = step.aux_targets
        if step.final_obs is not None and step.final_obs.shape[0]:
            buffer.final_obs.append(np.array(step.final_obs, np.float32))
            buffer.final_index.append(t * self.N + lo + step.final_obs_index.astype(np.int64))
        buffer.obs[t + 1, cols] = step.obs
        self._row[group] = t + 1
        if t + 1 < self.T:
            return []
        buffer.closed += 1
        self._rollout[group], self._row[group] = k + 1, 0
        self._buffer(k + 1).obs[0, cols] = step.obs
        if buffer.closed < len(self.sizes):
            return []
        del self._buffers[k]
        if self.recycling:
            self._completed[k] = buffer
        return [(k, buffer.rollout())]

    def recycle(self, k: int) -> None:
        """Nothing reads rollout k's arrays now: its buffer may serve a later rollout."""
        buffer = self._completed.pop(k)
        buffer.final_obs.clear()
        buffer.final_index.clear()
        buffer.version, buffer.closed = None, 0
        self._spare.append(buffer)

    def acted(self, group: int, actions: np.ndarray, log_probs: np.ndarray, version: int) -> None:
        """Write the server's answer to `group`'s last request into its current row."""
        lo, n = self.starts[group], self.sizes[group]
        buffer = self._buffer(self._rollout[group])
        t = self._row[group]
        buffer.actions[t, lo : lo + n] = actions
        buffer.log_probs[t, lo : lo + n] = log_probs
        buffer.version = version if buffer.version is None else min(buffer.version, version)

    def _check_outcome(self, step: GroupStep) -> None:
        labels, aux = step.bce_labels is not None, step.aux_targets
        aux_dim = None if aux is None else aux.shape[1]
        if not self._shaped:  # the first outcome fixes which labels the stream's rollouts have
            self._labels, self._aux_dim, self._shaped = labels, aux_dim, True
            for buffer in self._buffers.values():
                buffer.add_labels(self.T, self.N, labels, aux_dim, self.empty)
            return
        if labels != self._labels:
            raise InvalidInput("bce_labels", "on every outcome of the stream or on none",
                               "a change")  # fmt: skip
        if aux_dim != self._aux_dim:
            raise InvalidInput("aux_targets", f"[n, {self._aux_dim}] on every outcome",
                               "none" if aux is None else list(aux.shape))  # fmt: skip

    def _buffer(self, k: int) -> _Buffer:
        buffer = self._buffers.get(k)
        if buffer is None and self._spare:
            buffer = self._buffers[k] = self._spare.pop()
        if buffer is None:
            buffer = self._buffers[k] = _Buffer.empty(self.T, self.N, self.D, self.empty)
            buffer.add_labels(self.T, self.N, bool(self._labels), self._aux_dim, self.empty)
        return buffer
