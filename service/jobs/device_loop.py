"""The in-process loop with the environments beside the learner: Act -> env step -> Step, and on
the GPU nothing leaves the device.

The rollout is written into device buffers step by step (the actions of `Trainer.act_on_device`
go straight into `LobSim.step`), everything on the trainer's stream, and the Step's one read of
the device also brings back the rollout's statistics. So per Step the host waits for the device
once. On NumPy the same code runs on the host (the CPU tests compare it with the host loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from service.trainer.trainer import Trainer
from service.types import ActMode, DeviceRollout, StepResult

# The report vector a Step reads back with its statistics.
REWARD_SUM, EPISODES, RETURN_SUM = range(3)


@dataclass(frozen=True)
class LoopStep:
    """One Step of the loop: the Step's result and its rollout's statistics."""

    result: StepResult
    mean_reward: float  # mean reward per env step over the rollout
    episodes: int  # episodes that ended during the rollout
    return_sum: float  # sum of their returns


class DeviceEnv(Protocol):
    """N environments on an array backend (LobSim, bench/cartpole.py): `reset()` is the current
    observation; `step` auto-resets ended episodes and reports, in `info`, the observation an
    episode ended on ("final_obs", where it differs), the ended episodes' returns
    ("episode_return") and, with `label_dim` > 0, the perception labels of the previous
    observation ("bce_prev" [N], "aux_prev" [N, label_dim])."""

    xp: Any
    num_envs: int
    label_dim: int

    def reset(self) -> Any: ...

    def step(self, actions: Any) -> Any: ...


class PhaseMarks(Protocol):
    """Told where each phase of a loop Step begins ("act", "market", "update") and where the
    Step ends ("end"): what a bench times the phases with."""

    def mark(self, phase: str) -> None: ...


class DeviceLoop:
    """Collects `horizon`-step rollouts of `env` under the trainer's sampled policy and Steps
    on them, all on the trainer's backend. `phases`, if given, is told where each phase
    begins."""

    def __init__(
        self, trainer: Trainer, env: DeviceEnv, horizon: int, phases: PhaseMarks | None = None
    ) -> None:
        self.phases = phases
        if env.xp is not trainer.xp:
            raise ValueError(
                f"env: expected a LobSim on the trainer's backend ({trainer.backend.name})"
            )
        xp, dtype = trainer.xp, trainer.dtype
        self.trainer, self.env, self.horizon = trainer, env, horizon
        T, N, D = horizon, env.num_envs, trainer.config.model.obs_dim
        with trainer.on_device():
            self.obs = xp.empty((T + 1, N, D), dtype=dtype)
            self.next_obs = xp.empty((T, N, D), dtype=dtype)
            self.actions = xp.empty((T, N), dtype=np.int32)
            self.rewards = xp.empty((T, N), dtype=dtype)
            self.terminated = xp.empty((T, N), dtype=bool)
            self.truncated = xp.empty((T, N), dtype=bool)
            self.log_probs = xp.empty((T, N), dtype=dtype)
            labelled = env.label_dim > 0
            self.bce_labels = xp.empty((T, N), dtype=bool) if labelled else None
            self.aux_targets = xp.empty((T, N, env.label_dim), dtype=dtype) if labelled else None
            self.report = xp.zeros(3, dtype=np.float64)
        trainer.executor.synchronize_device()  # the env was built elsewhere: let it land first

    def step(self) -> LoopStep:
        """One rollout and one Step on it."""
        trainer, env, xp = self.trainer, self.env, self.trainer.xp
        mark = self.phases.mark if self.phases is not None else _unmarked
        with trainer.on_device():
            self.obs[0] = env.reset()
            self.report[...] = 0
            for t in range(self.horizon):
                mark("act")
                actions, log_probs, _ = trainer.act_on_device(self.obs[t], ActMode.SAMPLE)
                mark("market")
                out = env.step(actions)
                self.actions[t] = actions
                self.log_probs[t] = log_probs
                self.rewards[t] = out.reward
                self.terminated[t] = out.terminated
                self.truncated[t] = out.truncated
                self.obs[t + 1] = out.obs
                self.next_obs[t] = out.info.get("final_obs", out.obs)
                if self.bce_labels is not None and self.aux_targets is not None:
                    self.bce_labels[t] = out.info["bce_prev"]
                    self.aux_targets[t] = out.info["aux_prev"]
                ended = out.terminated | out.truncated
                self.report[EPISODES] += ended.sum()
                self.report[RETURN_SUM] += xp.where(ended, out.info["episode_return"], 0.0).sum()
            self.report[REWARD_SUM] = self.rewards.sum()
            rollout = DeviceRollout(
                obs=self.obs,
                next_obs=self.next_obs,
                actions=self.actions,
                rewards=self.rewards,
                terminated=self.terminated,
                truncated=self.truncated,
                behavior_log_probs=self.log_probs,
                bce_labels=self.bce_labels,
                aux_targets=self.aux_targets,
                policy_version=trainer.global_step,
            )
            mark("update")
            result, report = trainer.step_on_device(rollout, self.report)
            mark("end")
        return LoopStep(
            result=result,
            mean_reward=float(report[REWARD_SUM]) / self.rewards.size,
            episodes=int(report[EPISODES]),
            return_sum=float(report[RETURN_SUM]),
        )


def _unmarked(phase: str) -> None:
    """No phase timing."""
