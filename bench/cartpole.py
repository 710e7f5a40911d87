"""Gymnasium's CartPole-v1 on N environments at once, on NumPy or on the GPU (CuPy): the
CartPole-sized env of the integrated-loop bench (bench/lobsim.py --cartpole-sizes), to compare
the loop with the published figures of vectorised CartPole trainers.

The dynamics are Gymnasium's (`gymnasium/envs/classic_control/cartpole.py`, Euler integration,
float64 state, float32 observations, reward 1 per step, terminated past ±2.4 m or ±12°,
truncated at 500 steps like CartPole-v1's TimeLimit) with same-step autoreset: an env that ends
is reset within the step, `info["final_obs"]` holds the observation it ended on and
`info["episode_return"]` the return of the episode that ended. tests/benches/test_cartpole_bench.py
steps it beside Gymnasium's own env from the same states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASS_POLE + MASS_CART
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * math.pi / 360
MAX_STEPS = 500  # CartPole-v1's TimeLimit
OBS_DIM, NUM_ACTIONS = 4, 2


@dataclass(frozen=True)
class CartPoleStep:
    obs: Any  # [N, 4] float32
    reward: Any  # [N] float32
    terminated: Any  # [N] bool
    truncated: Any  # [N] bool
    info: dict[str, Any]


def dynamics(xp: Any, state: Any, actions: Any) -> Any:
    """One Euler step of Gymnasium's CartPole for every row of `state` [N, 4] (float64)."""
    x, x_dot, theta, theta_dot = state.T
    force = xp.where(actions == 1, FORCE, -FORCE)
    cos, sin = xp.cos(theta), xp.sin(theta)
    temp = (force + POLE_MASS_LENGTH * xp.square(theta_dot) * sin) / TOTAL_MASS
    theta_acc = (GRAVITY * sin - cos * temp) / (
        HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * xp.square(cos) / TOTAL_MASS)
    )
    x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
    return xp.stack(
        [x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot,
         theta_dot + TAU * theta_acc], axis=1,
    )  # fmt: skip


class CartPole:
    """N CartPoles; `backend` "numpy" or "cuda" (every array on the device)."""

    label_dim = 0  # no perception labels: the loop trains the RL heads alone

    def __init__(self, num_envs: int, seed: int, backend: str = "numpy") -> None:
        if backend == "cuda":
            import cupy as xp
        elif backend == "numpy":
            xp = np
        else:
            raise ValueError(f"backend: expected 'numpy' or 'cuda', got {backend!r}")
        self.xp, self.num_envs = xp, num_envs
        self.random = xp.random.RandomState(seed)
        self.state = self._initial(num_envs)
        self.t = xp.zeros(num_envs, dtype=xp.int64)
        self.returns = xp.zeros(num_envs, dtype=xp.float64)

    def _initial(self, n: int) -> Any:
        """Gymnasium's reset: every state variable uniform in [-0.05, 0.05)."""
        return self.random.uniform(-0.05, 0.05, (n, 4)).astype(self.xp.float64)

    def reset(self) -> Any:
        """The current observation, as LobSim's reset (the envs reset themselves when an
        episode ends)."""
        return self.state.astype(self.xp.float32)

    def step(self, actions: Any) -> CartPoleStep:
        xp = self.xp
        state = dynamics(xp, self.state, xp.asarray(actions).reshape(self.num_envs))
        x, theta = state[:, 0], state[:, 2]
        terminated = (x < -X_LIMIT) | (x > X_LIMIT) | (theta < -THETA_LIMIT) | (theta > THETA_LIMIT)
        self.t += 1
        truncated = (self.t >= MAX_STEPS) & ~terminated
        self.returns += 1.0
        ended = terminated | truncated
        final_obs = state.astype(xp.float32)
        episode_return = xp.where(ended, self.returns, 0.0)
        fresh = self._initial(self.num_envs)  # drawn every step: the stream never depends on ends
        self.state = xp.where(ended[:, None], fresh, state)
        self.t = xp.where(ended, 0, self.t)
        self.returns = xp.where(ended, 0.0, self.returns)
        return CartPoleStep(
            obs=self.state.astype(xp.float32),
            reward=xp.ones(self.num_envs, dtype=xp.float32),
            terminated=terminated,
            truncated=truncated,
            info={"final_obs": final_obs, "episode_return": episode_return},
        )
