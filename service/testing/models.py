"""The tests' models and random rollouts, for the tests and the benches that reproduce them: the
small model the CPU suite trains (`SMALL`, `small_config`), the GPU tests' sizes over it
(`GPU_SIZES`, `SHARDS`), random rollouts for it (`random_rollout`) and the same rollout a
rounding-sized step away (`nudged`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from service.config import Config, load_config
from service.types import Rollout

# The tests' small model, as `--set` settings.
SMALL = (
    "train.backend=numpy",  # the CPU suite tests the NumPy backend, GPU or not
    "model.obs_dim=6",
    "model.hidden_dim=16",
    "replay.min_size=16",
    "replay.batch_size=8",
    "ppo.num_minibatches=2",
    # A constant rate: a server's Steps then equal a bare Trainer's (a served trainer anneals
    # over train.steps otherwise; test_lr_schedule.py checks that against a scheduled Trainer).
    "train.lr_schedule=constant",
)

# The GPU tests' model over the small one: the sizes their tolerances were measured at on the
# H200, and a replay minimum above one Step's 30 rows, so the first Step trains no Q head and
# the Q head's shape arrives with the second (the graph tests capture that shape). The rate is
# set because optim.lr = 0 resolves per backend (2e-3 on CUDA, 3e-3 on NumPy).
GPU_SIZES = (
    "model.hidden_dim=64",
    "optim.lr=2e-3",
    "replay.capacity=2000",
    "replay.min_size=48",
    "replay.batch_size=32",
    "ppo.num_minibatches=3",
    "c51.target_update_period=5",
)
# The GPU sharding tests' two shards, each with a replay ring of its own.
SHARDS = ("train.data_shards=2", "replay.capacity=2048")


def small_config(*overrides: str) -> Config:
    """The small model plus `overrides`: what an in-process Trainer needs to match a server
    started by `running_server` with the same overrides."""
    return load_config(env={}, overrides=[*SMALL, *overrides])


def random_rollout(
    rng: np.random.Generator,
    T: int = 5,
    N: int = 6,
    D: int = 6,
    A: int = 9,
    K: int = 3,
    policy_version: int | None = None,
    extras: bool = True,
) -> Rollout:
    """A random rollout with some truncated steps (and their final observations), BCE labels
    and aux targets (when `extras`)."""
    truncated = rng.random((T, N)) < 0.15
    terminated = (rng.random((T, N)) < 0.15) & ~truncated
    index = np.flatnonzero(truncated.reshape(-1))
    return Rollout(
        obs=rng.standard_normal((T + 1, N, D)).astype(np.float32),
        actions=rng.integers(0, A, (T, N)).astype(np.int32),
        rewards=rng.standard_normal((T, N)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        behavior_log_probs=(np.log(1 / A) + 0.3 * rng.standard_normal((T, N))).astype(np.float32),
        final_obs=rng.standard_normal((index.size, D)).astype(np.float32),
        final_obs_index=index,
        bce_labels=rng.integers(0, 2, (T, N)).astype(np.uint8) if extras else None,
        aux_targets=rng.standard_normal((T, N, K)).astype(np.float32) if extras else None,
        policy_version=policy_version,
    )


def nudged(rollout: Rollout, towards: float) -> Rollout:
    """`rollout` with every observation one ulp towards `towards` (±inf): a rounding-sized
    difference in what a trainer sees."""
    return dataclasses.replace(rollout, obs=np.nextafter(rollout.obs, np.float32(towards)))
