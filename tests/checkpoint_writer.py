"""The checkpoint tests' model and data, and the writer process their crash test kills.

Run as a script (`python checkpoint_writer.py ROOT KEEP_LAST MAX_STEPS SEED`) it saves the fresh
trainer, then trains on `rollout(SEED, i)` for Step i and saves after every Step, printing
`ready` once set up; the crash test SIGKILLs it at a random moment.
"""

from __future__ import annotations

import sys

import numpy as np
from conftest import random_rollout, small_config

from service.checkpoint import save_checkpoint
from service.config import Config
from service.trainer.trainer import Trainer
from service.types import Rollout

# The small model with a replay minimum of two Steps' rows: the Q head starts training a Step
# after the other groups, so a restore must bring back a different AdamW step count per group.
REPLAY_MIN = "replay.min_size=32"


def checkpoint_config(*overrides: str) -> Config:
    """The checkpoint tests' model, plus `overrides`."""
    return small_config(REPLAY_MIN, *overrides)


def rollout(seed: int, step: int) -> Rollout:
    """Step `step`'s rollout of the data drawn from `seed`: 4 x 4, 16 transitions."""
    return random_rollout(np.random.default_rng([seed, step]), T=4, N=4)


def main(argv: list[str]) -> None:
    root, keep_last, max_steps, seed = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    trainer = Trainer(checkpoint_config())
    print("ready", flush=True)
    save_checkpoint(trainer, root, keep_last=keep_last)
    for step in range(max_steps):
        trainer.step(rollout(seed, step))
        save_checkpoint(trainer, root, keep_last=keep_last)


if __name__ == "__main__":
    main(sys.argv[1:])
