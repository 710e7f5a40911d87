"""Deterministic small-trainer training for the checkpoint tests.

Run as a script (`python checkpoint_writer.py ROOT KEEP_LAST MAX_STEPS`) it saves the fresh
trainer, then trains on rollout i generated from seed i and saves after every Step, printing
`ready` once set up; the crash test SIGKILLs it at a random moment.
"""

from __future__ import annotations

import sys

import numpy as np

from service.checkpoint import save_checkpoint
from service.config import Config, load_config
from service.trainer.trainer import Trainer
from service.types import Rollout

SMALL = [
    "train.backend=numpy",  # the CPU suite tests the NumPy backend, GPU or not
    "model.obs_dim=6",
    "model.hidden_dim=16",
    "replay.capacity=512",
    "replay.min_size=32",
    "replay.batch_size=16",
    "ppo.num_minibatches=2",
]


def small_config(*overrides: str) -> Config:
    """The tests' small model, plus `overrides`."""
    return load_config(env={}, overrides=[*SMALL, *overrides])


def make_rollout(config: Config, seed: int, T: int = 4, N: int = 4) -> Rollout:
    """A random rollout from `seed`, with truncated steps (and their final observations),
    terminations, BCE labels and aux targets."""
    rng = np.random.default_rng(seed)
    D, A, K = config.model.obs_dim, config.model.num_actions, config.model.aux_dim
    truncated = rng.random((T, N)) < 0.15
    truncated[0, 0] = True  # at least one truncated step every time
    terminated = (rng.random((T, N)) < 0.1) & ~truncated
    index = np.flatnonzero(truncated.reshape(-1))
    return Rollout(
        obs=rng.standard_normal((T + 1, N, D)).astype(np.float32),
        actions=rng.integers(0, A, (T, N)),
        rewards=rng.standard_normal((T, N)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        behavior_log_probs=np.full((T, N), -np.log(A), np.float32),
        final_obs=rng.standard_normal((index.size, D)).astype(np.float32),
        final_obs_index=index,
        bce_labels=rng.integers(0, 2, (T, N)).astype(np.uint8),
        aux_targets=rng.standard_normal((T, N, K)).astype(np.float32),
    )


def main(argv: list[str]) -> None:
    root, keep_last, max_steps = argv[0], int(argv[1]), int(argv[2])
    config = small_config()
    trainer = Trainer(config)
    print("ready", flush=True)
    save_checkpoint(trainer, root, keep_last=keep_last)
    for step in range(max_steps):
        trainer.step(make_rollout(config, step))
        save_checkpoint(trainer, root, keep_last=keep_last)


if __name__ == "__main__":
    main(sys.argv[1:])
