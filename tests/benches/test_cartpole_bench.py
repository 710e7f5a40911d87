"""bench/cartpole.py, the integrated-loop bench's CartPole: Gymnasium's dynamics from the same
states, same-step autoreset with the episode's final observation and return, CartPole-v1's
500-step truncation, and whole Steps of the device loop on it (NumPy here; tests/gpu on CuPy)."""

from __future__ import annotations

import gymnasium
import numpy as np
from conftest import small_config

from bench.cartpole import MAX_STEPS, NUM_ACTIONS, OBS_DIM, CartPole, dynamics
from service.jobs.device_loop import DeviceLoop
from service.trainer.trainer import Trainer


def test_dynamics_match_gymnasium_from_the_same_states(rng: np.random.Generator) -> None:
    states = rng.uniform([-2.4, -3, -0.2, -3], [2.4, 3, 0.2, 3], (300, 4))
    actions = rng.integers(0, NUM_ACTIONS, 300)
    env = gymnasium.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    expected = []
    for state, action in zip(states, actions, strict=True):
        env.state, env.steps_beyond_terminated = state.copy(), None
        env.step(int(action))
        expected.append(np.asarray(env.state, dtype=np.float64))
    # Gymnasium works on scalars, this on arrays: NumPy's vectorised sin/cos may differ in the
    # last bit, so the comparison allows a few ulps.
    np.testing.assert_allclose(dynamics(np, states, actions), expected, rtol=1e-13, atol=1e-15)


def test_episodes_end_reset_and_report_their_return_and_final_obs(
    rng: np.random.Generator, seed: int
) -> None:
    env = CartPole(64, seed)
    lengths = np.zeros(64, dtype=int)
    ended_any = False
    for _ in range(60):
        before = env.state.copy()
        actions = rng.integers(0, NUM_ACTIONS, 64)
        out = env.step(actions)
        lengths += 1
        after = dynamics(np, before, actions)
        ended = out.terminated | out.truncated
        np.testing.assert_array_equal(out.info["final_obs"], after.astype(np.float32))
        np.testing.assert_array_equal(out.obs[~ended], after[~ended].astype(np.float32))
        assert (np.abs(out.obs[ended]) <= 0.05).all()  # a fresh episode's first observation
        np.testing.assert_array_equal(out.info["episode_return"][ended], lengths[ended])
        assert (out.info["episode_return"][~ended] == 0).all() and (out.reward == 1).all()
        lengths[ended] = 0
        ended_any |= bool(ended.any())
    assert ended_any and out.obs.dtype == np.float32 and out.obs.shape == (64, OBS_DIM)


def test_an_episode_is_truncated_at_500_steps(seed: int) -> None:
    env = CartPole(8, seed)
    env.t[:] = MAX_STEPS - 1
    env.state[:] = 0.0  # upright and still: this step does not terminate
    out = env.step(np.zeros(8, dtype=np.int64))
    assert out.truncated.all() and not out.terminated.any()
    assert (env.t == 0).all() and (out.info["episode_return"] > 0).all()


def test_the_device_loop_steps_on_cartpole(seed: int) -> None:
    config = small_config("model.obs_dim=4", "model.num_actions=2", "model.aux_dim=0",
                          f"train.seed={seed}")  # fmt: skip
    loop = DeviceLoop(Trainer(config), CartPole(16, seed), 32)
    steps = [loop.step() for _ in range(3)]
    assert [s.result.global_step for s in steps] == [1, 2, 3]
    assert all(s.mean_reward == 1.0 and np.isfinite(s.result.losses["total"]) for s in steps)
    assert sum(s.episodes for s in steps) > 0  # random play drops the pole within ~20 steps
    assert all(s.return_sum >= s.episodes for s in steps)
