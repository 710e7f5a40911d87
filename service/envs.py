"""LobSim as the loops' vector environment (`service/vector_env.py`'s VectorEnv)."""

from __future__ import annotations

import numpy as np

from service.config import LobsimConfig
from service.lobsim.env import LobSim
from service.vector_env import EnvStep


class LobSimVectorEnv:
    """N LobSim markets; `step` returns the loop's EnvStep with the perception labels of the
    observation each step started from, and keeps the returns of finished episodes."""

    def __init__(self, num_envs: int, cfg: LobsimConfig, seed: int) -> None:
        self.env = LobSim(num_envs, cfg, seed)
        self.num_envs = num_envs
        self.obs = self.env.reset()
        self.finished_returns: list[float] = []

    def step(self, actions: np.ndarray) -> EnvStep:
        out = self.env.step(actions)
        self.obs = out.obs
        ended = out.info["episode_return"][out.terminated]
        self.finished_returns.extend(float(r) for r in ended)
        return EnvStep(
            obs=out.obs,
            rewards=out.reward,
            terminated=out.terminated,
            truncated=out.truncated,
            final_obs=np.zeros((0, out.obs.shape[1]), dtype=np.float32),
            bce_labels=out.info["bce_prev"],
            aux_targets=out.info["aux_prev"],
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        """The markets' state (`LobSim.state_dict`); the returns not yet taken are not in it."""
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Markets as `state_dict` gave them; their current observation with them."""
        self.env.load_state_dict(state)
        self.obs = self.env.reset()

    def take_returns(self) -> list[float]:
        """Returns of the episodes finished since the last call."""
        returns, self.finished_returns = self.finished_returns, []
        return returns
