"""The settings an env decides (service/envs.py, fit_to_env): the C51 support from a random
policy's play, checked against returns summed episode by episode, the known supports of
CartPole and Acrobot, the user's support and sizes kept, LobSim's support left as recorded."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import C51Config, load_config
from service.envs import HOST_NUM_ENVS, fit_to_env, probe_support, support_from_play
from service.errors import InvalidInput


def returns_by_episode(rewards: np.ndarray, ended: np.ndarray, gamma: float) -> np.ndarray:
    """Every step's discounted return-to-go, summed forward over the rest of its episode (the
    probe's end cutting the last one): the definition, apart from the backward recursion."""
    T, N = rewards.shape
    out = np.empty((T, N))
    for i in range(N):
        for t in range(T):
            total, k = 0.0, t
            while k < T:
                total += gamma ** (k - t) * rewards[k, i]
                if ended[k, i]:
                    break
                k += 1
            out[t, i] = total
    return out


def test_the_support_spans_the_returns_seen_and_the_rewards_over_the_horizon(
    rng: np.random.Generator,
) -> None:
    T, N = 40, 5
    gamma = float(rng.uniform(0.8, 0.99))
    rewards = rng.normal(float(rng.uniform(-1, 1)), 2.0, (T, N))
    ended = rng.random((T, N)) < 0.1
    terminated = ended & (rng.random((T, N)) < 0.5)
    rewards[terminated] += 50 * rng.choice([-1, 1], terminated.sum())  # one-off bonuses
    v_min, v_max = support_from_play(rewards, terminated, ended, gamma)
    seen = returns_by_episode(rewards, ended, gamma)
    flow = rewards[~terminated]
    low = min(min(0.0, np.percentile(flow, 1)) / (1 - gamma), seen.min())
    high = max(max(0.0, np.percentile(flow, 99)) / (1 - gamma), seen.max())
    assert v_min <= low and v_max >= high
    # rounded outward by less than one unit of the second significant digit
    assert low - v_min < 10 ** (np.floor(np.log10(abs(low))) - 1) + 1e-9
    assert v_max - high < 10 ** (np.floor(np.log10(abs(high))) - 1) + 1e-9


@pytest.mark.parametrize(
    ("env", "support"),
    [("gymnasium:CartPole-v1", (0.0, 100.0)), ("gymnasium:Acrobot-v1", (-100.0, 0.0))],
)
def test_known_supports(env: str, support: tuple[float, float], seed: int) -> None:
    """CartPole pays 1 per step, Acrobot -1 until the end: [0, 1/(1-γ)] and [-1/(1-γ), 0]."""
    config = load_config(env={}, overrides=[f"train.seed={seed}"])
    assert probe_support(env, config) == support
    fitted = fit_to_env(config, env)
    assert (fitted.c51.v_min, fitted.c51.v_max) == support


def test_the_probe_is_deterministic_in_the_seed(seed: int) -> None:
    config = load_config(env={}, overrides=[f"train.seed={seed}"])
    env = "gymnasium:LunarLander-v3"
    pytest.importorskip("Box2D")
    assert probe_support(env, config) == probe_support(env, config)


def test_what_the_user_set_is_kept() -> None:
    config = load_config(env={}, overrides=["c51.v_min=-3", "train.num_envs=7"])
    fitted = fit_to_env(config, "gymnasium:CartPole-v1")
    assert (fitted.c51.v_min, fitted.c51.v_max, fitted.train.num_envs) == (-3.0, 10.0, 7)
    assert (fitted.model.obs_dim, fitted.model.num_actions, fitted.model.aux_dim) == (4, 2, 0)
    assert fit_to_env(load_config(env={}), "gymnasium:CartPole-v1").train.num_envs == \
        HOST_NUM_ENVS  # fmt: skip
    with pytest.raises(InvalidInput, match=r"model.num_actions: expected 2 for --env gymnasium:"
                       r"CartPole-v1, got 5"):  # fmt: skip
        fit_to_env(load_config(env={}, overrides=["model.num_actions=5"]),
                   "gymnasium:CartPole-v1")  # fmt: skip


def test_lobsim_keeps_its_recorded_support_and_backend_sizes() -> None:
    fitted = fit_to_env(load_config(env={}), "lobsim")
    assert (fitted.c51.v_min, fitted.c51.v_max) == (C51Config().v_min, C51Config().v_max)
    assert fitted.train.num_envs == 0  # the backend's (BACKEND_DEFAULTS)
    assert (fitted.model.num_actions, fitted.model.aux_dim) == (9, 3)


def test_the_default_model_is_lobsims() -> None:
    """A plain `trident serve` (no --env, no --set) serves `trident actor --env lobsim`: the
    model's default sizes are what LobSim at its default settings needs."""
    defaults = load_config(env={})
    assert fit_to_env(defaults, "lobsim").model == defaults.model
