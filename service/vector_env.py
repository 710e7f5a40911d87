"""The vector-environment protocol the loops and the actor share: N environments stepping
together with auto-reset, and the collection of a time-major rollout from them under a policy.
NumPy and the shared types only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.types import Rollout


@dataclass(frozen=True)
class EnvStep:
    """One vectorised environment transition (the Gymnasium vector-API shape)."""

    obs: np.ndarray  # [N, D] next observations (after auto-reset)
    rewards: np.ndarray  # [N]
    terminated: np.ndarray  # [N] bool
    truncated: np.ndarray  # [N] bool
    final_obs: np.ndarray  # [M, D] final observations of the truncated envs, in env order
    # Perception labels of the observation this step started from (None: the env has none)
    bce_labels: np.ndarray | None = None  # [N] in {0, 1}
    aux_targets: np.ndarray | None = None  # [N, K]


class VectorEnv(Protocol):
    """What the loop needs of an environment: N envs stepping together, auto-reset."""

    num_envs: int
    obs: np.ndarray  # [N, D] current observations

    def step(self, actions: np.ndarray) -> EnvStep: ...


class Acted(Protocol):
    """What a policy call returns (Trainer.act's ActResult, or the client's Act reply)."""

    actions: np.ndarray
    log_probs: np.ndarray
    policy_version: int


def collect_rollout(act: Callable[[np.ndarray], Acted], env: VectorEnv, horizon: int) -> Rollout:
    """T steps of every env under the policy `act` (sampled actions), time-major. The rollout's
    policy version is the oldest that acted, so a remote policy's lag is never understated."""
    observations = [env.obs]
    actions, log_probs, rewards, terminated, truncated = [], [], [], [], []
    final_obs, final_index, bce_labels, aux_targets, versions = [], [], [], [], []
    for t in range(horizon):
        acted = act(observations[-1])
        moved = env.step(acted.actions)
        versions.append(acted.policy_version)
        actions.append(acted.actions)
        log_probs.append(acted.log_probs.astype(np.float32))
        rewards.append(moved.rewards)
        terminated.append(moved.terminated)
        truncated.append(moved.truncated)
        final_obs.append(moved.final_obs)
        final_index.append(t * env.num_envs + np.flatnonzero(moved.truncated))
        observations.append(moved.obs)
        bce_labels.append(moved.bce_labels)
        aux_targets.append(moved.aux_targets)
    return Rollout(
        obs=np.stack(observations),
        actions=np.stack(actions),
        rewards=np.stack(rewards),
        terminated=np.stack(terminated),
        truncated=np.stack(truncated),
        behavior_log_probs=np.stack(log_probs),
        final_obs=np.concatenate(final_obs),
        final_obs_index=np.concatenate(final_index),
        policy_version=min(versions),
        bce_labels=None if bce_labels[0] is None else np.stack(bce_labels),
        aux_targets=None if aux_targets[0] is None else np.stack(aux_targets),
    )
