"""Whole-episode returns of a policy on held-out LobSim seeds, beside simple baselines."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.config import LobsimConfig
from service.lobsim.env import NUM_ACTIONS, LobSim

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs, action mask) -> actions


def episode_returns(policy: Policy, cfg: LobsimConfig, seed: int, num_envs: int) -> np.ndarray:
    """One full episode of `num_envs` markets (seed `seed`) under `policy`: return per env."""
    env = LobSim(num_envs, cfg, seed)
    obs = env.reset()
    for _ in range(cfg.horizon):
        out = env.step(policy(obs, env.action_mask()))
        obs = out.obs
    if not out.terminated.all():
        raise RuntimeError("an episode did not end after lobsim.horizon steps")
    return out.info["episode_return"]


def constant(action: int) -> Policy:
    return lambda obs, mask: np.full(obs.shape[0], action)


def uniform_random(seed: int) -> Policy:
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return rng.integers(0, NUM_ACTIONS, obs.shape[0])

    return act


def summary(returns: np.ndarray) -> str:
    """mean ± 95 % interval (normal approximation) of per-episode returns."""
    half = 1.96 * returns.std(ddof=1) / np.sqrt(returns.size) if returns.size > 1 else 0.0
    return f"{returns.mean():9.2f} ± {half:6.2f}"
