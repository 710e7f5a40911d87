"""The data types the service's parts share: Act modes and results, Step results, the heads,
committed checkpoints, rollouts and replay transitions. NumPy only, so a client, an actor, a
front end or a test can use them without loading the trainer or a backend."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

__all__ = [
    "FLOAT_FIELDS", "HEADS", "ActMode", "ActResult", "CheckpointInfo", "DeviceRollout", "Rollout",
    "StepResult", "Transitions",
]
HEADS = ("q", "pi", "v", "bce", "aux")  # the model's heads on its one encoder
# A rollout's floating-point inputs, which the non-finite guard checks.
FLOAT_FIELDS = ("obs", "rewards", "behavior_log_probs", "final_obs", "aux_targets")
# A Rollout's fields in the dtypes its digest reads them in ("flag": 0/1 bytes).
DIGEST_DTYPES = {
    "obs": "<f4", "actions": "<i4", "rewards": "<f4", "terminated": "flag", "truncated": "flag",
    "behavior_log_probs": "<f4", "final_obs": "<f4", "final_obs_index": "<i8",
    "bce_labels": "flag", "aux_targets": "<f4",
}  # fmt: skip


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


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint. `save_ms` is how long its save took, from the start until the
    state files were written and fsynced (recorded in the manifest, so listings have it too);
    None for a checkpoint whose manifest records none."""

    name: str
    global_step: int
    path: Path
    size_bytes: int
    save_ms: float | None
    created_unix: float
    commit_sequence: int  # the order of commits under the root; 0 where the manifest has none


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
    warnings: list[str] = field(default_factory=list)  # settings that do not fit the data
    replayed: bool = False  # the answer to a key applied before: nothing was applied now
    checkpoint_step: int = 0  # global step of the server's newest checkpoint (0: none)
    state_epoch: int = 0  # the server's id of its current state (new at start and Restore)


class _TimeMajor:
    """[T, N] arrays of T steps of N envs: the shape of a rollout's actions."""

    actions: np.ndarray

    @property
    def horizon(self) -> int:
        return self.actions.shape[0]

    @property
    def num_envs(self) -> int:
        return self.actions.shape[1]


@dataclass(frozen=True)
class Rollout(_TimeMajor):
    """What N actors saw over T steps, time-major.

    obs[T] is the bootstrap observation. Where `truncated[t, n]`, obs[t + 1, n] already belongs
    to the next episode; the episode's own final observation is `final_obs[i]` for the flat
    index `final_obs_index[i] = t * N + n`. Termination and truncation stay apart: a truncated
    step bootstraps from its final observation, a terminated one does not.
    """

    obs: np.ndarray  # [T+1, N, D] float
    actions: np.ndarray  # [T, N] int, in [0, A)
    rewards: np.ndarray  # [T, N] float
    terminated: np.ndarray  # [T, N] bool
    truncated: np.ndarray  # [T, N] bool
    behavior_log_probs: np.ndarray  # [T, N] float, log π_old(a_t | s_t) of the acting policy
    final_obs: np.ndarray | None = None  # [M, D] float
    final_obs_index: np.ndarray | None = None  # [M] int, flat t * N + n of each truncated step
    bce_labels: np.ndarray | None = None  # [T, N] in {0, 1}
    aux_targets: np.ndarray | None = None  # [T, N, K] float
    policy_version: int | None = None  # the version the actor's Act calls returned

    def float_fields(self) -> dict[str, np.ndarray]:
        """Every floating-point input, for the non-finite guard (FLOAT_FIELDS order)."""
        fields = {name: getattr(self, name) for name in FLOAT_FIELDS}
        return {name: value for name, value in fields.items() if value is not None}

    def digest(self) -> str:
        """sha256 of what the rollout says: each field's name, shape and values in one
        canonical dtype (float32, int32 actions, int64 indices, 0/1 bytes for flags), and the
        policy version. The same Step sent again has the same digest, whichever accepted
        dtypes carried it; no final observations and an empty set of them hash alike."""
        h = hashlib.sha256(f"rollout v1 policy_version={self.policy_version}".encode())
        for name, dtype in DIGEST_DTYPES.items():
            array = getattr(self, name)
            if array is None or (name.startswith("final_obs") and array.size == 0):
                h.update(f"|{name}:none".encode())
                continue
            canonical = np.ascontiguousarray(array, np.uint8 if dtype == "flag" else dtype)
            h.update(f"|{name}:{list(canonical.shape)}".encode())
            h.update(canonical.data)  # sha256 lets the GIL go for large buffers
        return h.hexdigest()

    @property
    def layout(self) -> tuple[int, int, bool, int | None]:
        """What rollouts must share to be one Step side by side: the horizon T, the
        observation width D, whether BCE labels come along, and the aux targets' width K."""
        aux = None if self.aux_targets is None else self.aux_targets.shape[2]
        return self.horizon, self.obs.shape[2], self.bce_labels is not None, aux

    @classmethod
    def side_by_side(cls, parts: list[Rollout], empty: Callable[..., np.ndarray]) -> Rollout:
        """One rollout of `parts`' environment columns in their order (the inverse of
        `columns`), its arrays made by `empty(shape, dtype)`; the policy version is the oldest
        part's. Every part has the same `layout`. One part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        starts = np.cumsum([0] + [part.num_envs for part in parts]).tolist()
        N = starts[-1]

        def joined(name: str) -> np.ndarray | None:
            arrays = [getattr(part, name) for part in parts]
            if arrays[0] is None:
                return None
            shape = (arrays[0].shape[0], N, *arrays[0].shape[2:])
            # unsafe: flags come as bool (a stream's) or as uint8 in {0, 1} (a request's,
            # validated), the same values either way
            return np.concatenate(arrays, axis=1, out=empty(shape, arrays[0].dtype),
                                  casting="unsafe")  # fmt: skip

        final_obs, final_index = [], []
        for part, start in zip(parts, starts, strict=False):
            if part.final_obs is not None and part.final_obs.size:
                # flat t * n + j in a part of n columns is t * N + start + j here
                t, j = np.divmod(part.final_obs_index.astype(np.int64), part.num_envs)
                final_obs.append(part.final_obs)
                final_index.append(t * N + start + j)
        versions = [part.policy_version for part in parts if part.policy_version is not None]
        return cls(
            obs=joined("obs"),
            actions=joined("actions"),
            rewards=joined("rewards"),
            terminated=joined("terminated"),
            truncated=joined("truncated"),
            behavior_log_probs=joined("behavior_log_probs"),
            final_obs=np.concatenate(final_obs) if final_obs else None,
            final_obs_index=np.concatenate(final_index) if final_index else None,
            bce_labels=joined("bce_labels"),
            aux_targets=joined("aux_targets"),
            policy_version=min(versions) if versions else None,
        )

    def columns(self, start: int, stop: int) -> Rollout:
        """The environments [start, stop) alone (a data-parallel rank's share), final
        observations and their flat indices included."""
        block = slice(start, stop)
        final_obs, final_index = self.final_obs, self.final_obs_index
        if final_obs is not None and final_index is not None:
            t, n = np.divmod(np.asarray(final_index), self.num_envs)
            mine = (n >= start) & (n < stop)
            final_obs = final_obs[mine]
            final_index = (t[mine] * (stop - start) + n[mine] - start).astype(final_index.dtype)
        return Rollout(
            obs=self.obs[:, block],
            actions=self.actions[:, block],
            rewards=self.rewards[:, block],
            terminated=self.terminated[:, block],
            truncated=self.truncated[:, block],
            behavior_log_probs=self.behavior_log_probs[:, block],
            final_obs=final_obs,
            final_obs_index=final_index,
            bce_labels=None if self.bce_labels is None else self.bce_labels[:, block],
            aux_targets=None if self.aux_targets is None else self.aux_targets[:, block],
            policy_version=self.policy_version,
        )


@dataclass(frozen=True)
class DeviceRollout(_TimeMajor):
    """A rollout already in the trainer's memory (the in-process GPU loop), time-major like
    `Rollout`, with the observation after every step given dense: `next_obs[t, n]` is s_{t+1}
    before any auto-reset (the final observation where the episode ended), since how many
    episodes ended is a number only the device knows.

    Only shapes and dtypes are checked, on the host: reading values would cost a device sync.
    A non-finite value or an action outside [0, A) leaves the whole Step unapplied instead,
    through the updates' guard.
    """

    obs: np.ndarray  # [T+1, N, D] float
    next_obs: np.ndarray  # [T, N, D] float
    actions: np.ndarray  # [T, N] int
    rewards: np.ndarray  # [T, N] float
    terminated: np.ndarray  # [T, N] bool
    truncated: np.ndarray  # [T, N] bool
    behavior_log_probs: np.ndarray  # [T, N] float
    bce_labels: np.ndarray | None = None  # [T, N] bool or 0/1 integers
    aux_targets: np.ndarray | None = None  # [T, N, K] float
    policy_version: int | None = None

    def float_fields(self) -> dict[str, np.ndarray]:
        """Every floating-point input, for the non-finite guard."""
        fields = {
            "obs": self.obs,
            "next_obs": self.next_obs,
            "rewards": self.rewards,
            "behavior_log_probs": self.behavior_log_probs,
            "aux_targets": self.aux_targets,
        }
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class Transitions:
    """Flat n-step transitions for the replay buffer (one per rollout step, t-major order)."""

    obs: np.ndarray  # [B, D]
    actions: np.ndarray  # [B] int32
    rewards: np.ndarray  # [B] Σ_{j<k} γ^j r_{t+j}
    dones: np.ndarray  # [B] uint8: the k-step window ended in termination
    horizons: np.ndarray  # [B] int32: k, the steps actually summed (<= n)
    next_obs: np.ndarray  # [B, D] the observation k steps later (final obs at truncation)
