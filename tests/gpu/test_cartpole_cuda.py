"""bench/cartpole.py on the device: the same dynamics as on NumPy from the same states, and the
device loop trains on it with a CUDA trainer (the CartPole row of bench/lobsim.py)."""

from __future__ import annotations

import numpy as np
from conftest import fresh_seed, small_config

from bench.cartpole import NUM_ACTIONS, CartPole, dynamics
from service.jobs.device_loop import DeviceLoop
from service.trainer.trainer import Trainer


def test_cuda_dynamics_match_numpy(rng: np.random.Generator) -> None:
    import cupy

    states = rng.uniform([-2.4, -3, -0.2, -3], [2.4, 3, 0.2, 3], (4099, 4))
    actions = rng.integers(0, NUM_ACTIONS, 4099)
    got = dynamics(cupy, cupy.asarray(states), cupy.asarray(actions)).get()
    # CUDA's sin/cos and fused multiply-adds differ from NumPy's in the last bits
    np.testing.assert_allclose(got, dynamics(np, states, actions), rtol=1e-12, atol=1e-14)


def test_the_device_loop_trains_on_cuda_cartpoles() -> None:
    seed = fresh_seed()
    config = small_config("train.backend=cuda", "model.obs_dim=4", "model.num_actions=2",
                          "model.aux_dim=0", f"train.seed={seed}")  # fmt: skip
    env = CartPole(1024, seed, backend="cuda")
    loop = DeviceLoop(Trainer(config), env, 32)
    steps = [loop.step() for _ in range(4)]
    assert [s.result.global_step for s in steps] == [1, 2, 3, 4]
    assert all(np.isfinite(s.result.losses["total"]) and not s.result.skipped for s in steps)
    assert sum(s.episodes for s in steps) > 0 and all(s.mean_reward == 1.0 for s in steps)
