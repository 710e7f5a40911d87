"""The in-process training loop: Act -> environment step -> Step, one rollout at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.trainer.trainer import Trainer
from service.types import ActMode, Rollout, StepResult


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


@dataclass(frozen=True)
class Progress:
    step: int
    result: StepResult
    mean_reward: float  # mean reward per env step over the rollout


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


def train(
    trainer: Trainer,
    env: VectorEnv,
    steps: int,
    horizon: int,
    on_step: Callable[[Progress], None] = lambda progress: None,
) -> None:
    """Run `steps` Steps, calling `on_step` after each."""
    for _ in range(steps):
        rollout = collect_rollout(lambda obs: trainer.act(obs, ActMode.SAMPLE), env, horizon)
        result = trainer.step(rollout)
        on_step(Progress(trainer.global_step, result, float(rollout.rewards.mean())))
