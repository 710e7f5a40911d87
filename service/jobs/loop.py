"""The in-process training loop: Act -> environment step -> Step, one rollout at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.trainer.trainer import Trainer
from service.types import ActMode, StepResult
from service.vector_env import VectorEnv, collect_rollout


@dataclass(frozen=True)
class LoopProgress:
    step: int
    result: StepResult
    mean_reward: float  # mean reward per env step over the rollout


def train(
    trainer: Trainer,
    env: VectorEnv,
    steps: int,
    horizon: int,
    on_step: Callable[[LoopProgress], None] = lambda progress: None,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Run `steps` Steps, calling `on_step` after each; fewer when `stop()` says so before
    one."""
    for _ in range(steps):
        if stop():
            break
        rollout = collect_rollout(lambda obs: trainer.act(obs, ActMode.SAMPLE), env, horizon)
        result = trainer.step(rollout)
        on_step(LoopProgress(trainer.global_step, result, float(rollout.rewards.mean())))
