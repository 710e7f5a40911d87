"""Learning: on a contextual bandit, greedy-π and greedy-Q both find the rewarded action."""

from __future__ import annotations

import numpy as np

from service.config import load_config
from service.jobs.loop import train
from service.synthetic import ContextualBandit
from service.trainer.trainer import Trainer
from service.types import ActMode

STEP_BUDGET = 60


def accuracy(trainer: Trainer, env: ContextualBandit, mode: ActMode) -> float:
    obs, correct = env.evaluation_set(4096, seed=12345)
    return float(np.mean(trainer.act(obs, mode).actions == correct))


def test_contextual_bandit_is_learned_within_budget(seed: int) -> None:
    config = load_config(
        env={},
        overrides=[
            f"train.seed={seed}",
            "train.backend=numpy",
            "model.obs_dim=16",
            "model.hidden_dim=64",
            "train.num_envs=32",
            "train.rollout_len=8",
            "replay.min_size=256",
            "replay.batch_size=64",
            "ppo.num_minibatches=2",
            "optim.lr=1e-3",
        ],
    )
    trainer = Trainer(config)
    env = ContextualBandit(32, 16, 9, seed, noise=0.6)
    assert accuracy(trainer, env, ActMode.GREEDY_PI) < 0.4  # chance is 1/9
    assert accuracy(trainer, env, ActMode.GREEDY_Q) < 0.4
    train(trainer, env, STEP_BUDGET, 8)
    assert accuracy(trainer, env, ActMode.GREEDY_PI) >= 0.95
    assert accuracy(trainer, env, ActMode.GREEDY_Q) >= 0.95
