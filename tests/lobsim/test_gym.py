"""LobSim behind Gymnasium's VectorEnv API (service/lobsim/gym.py): spaces, dtypes, seeding,
same-step autoreset against LobSim itself, and Gymnasium's own vector wrappers.

Gymnasium 1.4 has no checker for vector envs (`gymnasium.utils.env_checker.check_env` takes a
single Env), so the steps are compared with LobSim's directly and the env is run through the
vector wrappers that read `metadata["autoreset_mode"]`.
"""

from __future__ import annotations

import importlib
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete, MultiDiscrete
from gymnasium.vector import AutoresetMode

from service.config import LobsimConfig
from service.lobsim.env import NUM_ACTIONS, LobSim, feature_column, observation_dim
from service.lobsim.gym import LobSimGymVectorEnv

CFG = LobsimConfig(horizon=4)
N = 5
TIME_LEFT = feature_column(CFG, "time_left")


def test_spaces_and_metadata() -> None:
    env = LobSimGymVectorEnv(N, CFG, seed=0)
    D = observation_dim(CFG)
    assert isinstance(env, gymnasium.vector.VectorEnv)
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.single_observation_space == Box(-np.inf, np.inf, (D,), np.float32)
    assert env.single_action_space == Discrete(NUM_ACTIONS)
    assert env.observation_space == Box(-np.inf, np.inf, (N, D), np.float32)
    assert env.action_space == MultiDiscrete(np.full(N, NUM_ACTIONS))
    assert env.num_envs == N


def test_reset_and_step_shapes_and_dtypes(seed: int) -> None:
    env = LobSimGymVectorEnv(N, CFG)
    obs, info = env.reset(seed=seed)
    assert info == {} and obs in env.observation_space
    env.action_space.seed(seed)
    obs, rewards, terminations, truncations, infos = env.step(env.action_space.sample())
    assert obs in env.observation_space
    assert rewards.shape == (N,) and rewards.dtype == np.float32
    assert terminations.shape == truncations.shape == (N,)
    assert terminations.dtype == truncations.dtype == np.bool_
    assert infos["aux_prev"].shape == (N, 3) and infos["_aux_prev"].all()
    assert "final_obs" not in infos and "episode_return" not in infos


def rollout(
    env: LobSimGymVectorEnv, seed: int, actions_seed: int, steps: int = 6
) -> list[np.ndarray]:
    """Observations and rewards of `steps` random actions (drawn from `actions_seed`) after
    `reset(seed=seed)`."""
    obs, _ = env.reset(seed=seed)
    seen = [obs.copy()]
    rng = np.random.default_rng(actions_seed)
    for _ in range(steps):
        obs, rewards, *_ = env.step(rng.integers(0, NUM_ACTIONS, N))
        seen += [obs.copy(), rewards.copy()]
    return seen


def test_seeding_is_deterministic(seed: int) -> None:
    env = LobSimGymVectorEnv(N, CFG, seed=seed)
    first = rollout(env, seed + 1, seed)
    again = rollout(env, seed + 1, seed)  # reset(seed) rebuilds the markets
    fresh = rollout(LobSimGymVectorEnv(N, CFG, seed=seed + 2), seed + 1, seed)
    other = rollout(env, seed + 3, seed)
    for a, b, c in zip(first, again, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    assert not np.array_equal(first[0], other[0])
    assert env.np_random_seed == seed + 3


def test_reset_without_seed_returns_the_current_observations(seed: int) -> None:
    env = LobSimGymVectorEnv(N, CFG, seed=seed)
    env.step(np.full(N, 2))
    obs, _, _, _, _ = env.step(np.zeros(N, np.int64))
    again, info = env.reset()
    np.testing.assert_array_equal(again, obs)
    assert info == {}


def test_steps_equal_lobsim_and_an_episode_end_moves_the_final_obs_into_infos(
    seed: int, rng: np.random.Generator
) -> None:
    env = LobSimGymVectorEnv(N, CFG, seed=seed)
    sim = LobSim(N, CFG, seed=seed)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs, sim.reset())
    for t in range(1, 2 * CFG.horizon + 1):
        actions = rng.integers(0, NUM_ACTIONS, N)
        obs, rewards, terminations, truncations, infos = env.step(actions)
        out = sim.step(actions)
        np.testing.assert_array_equal(obs, out.obs)
        np.testing.assert_array_equal(rewards, out.reward)
        np.testing.assert_array_equal(terminations, out.terminated)
        assert not truncations.any()
        np.testing.assert_array_equal(infos["pnl"], out.info["pnl"])
        if t % CFG.horizon:
            assert not terminations.any() and "final_obs" not in infos
            assert infos["_pnl"].all()
            continue
        assert terminations.all()  # every market ends its episode after `horizon` steps
        assert infos["_final_obs"].all() and infos["_final_info"].all()
        assert not infos["_pnl"].any()  # the ended envs' step info moved into final_info
        for i in range(N):
            np.testing.assert_array_equal(infos["final_obs"][i], out.info["final_obs"][i])
        final = np.stack(list(infos["final_obs"]))
        assert (final[:, TIME_LEFT] == 0).all() and (obs[:, TIME_LEFT] == 1).all()
        final_info = infos["final_info"]
        np.testing.assert_array_equal(final_info["episode_return"], out.info["episode_return"])
        np.testing.assert_array_equal(final_info["inventory"], 0)  # liquidated
        assert final_info["_episode_return"].all()


def test_record_episode_statistics_follows_the_same_step_autoreset(
    seed: int, rng: np.random.Generator
) -> None:
    """Gymnasium's RecordEpisodeStatistics reads `metadata["autoreset_mode"]`: under SAME_STEP
    it counts every step, so its episode returns and lengths must be LobSim's. (Gymnasium
    1.4's observation wrappers refuse SAME_STEP envs.)"""
    env = gymnasium.wrappers.vector.RecordEpisodeStatistics(LobSimGymVectorEnv(N, CFG))
    env.reset(seed=seed)
    for t in range(1, 2 * CFG.horizon + 1):
        *_, terminations, _, infos = env.step(rng.integers(0, NUM_ACTIONS, N))
        assert terminations.all() == (t % CFG.horizon == 0)
        if terminations.all():
            np.testing.assert_allclose(
                infos["episode"]["r"], infos["final_info"]["episode_return"], rtol=1e-5
            )
            assert (infos["episode"]["l"] == CFG.horizon).all()
    assert env.episode_count == 2 * N


def test_without_gymnasium_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    monkeypatch.delitem(sys.modules, "service.lobsim.gym")
    with pytest.raises(ImportError, match=r"pip install 'trident\[gym\]'"):
        importlib.import_module("service.lobsim.gym")
