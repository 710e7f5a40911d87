"""LobSim as a Gymnasium vector environment (`pip install 'trident[gym]'`).

LobSim resets an ended market inside the step that ends it, which is Gymnasium's same-step
autoreset (https://farama.org/Vector-Autoreset-Mode): `step` returns the new episode's first
observation, and the ended episode's last observation and step info are in
`infos["final_obs"]` / `infos["final_info"]`, masked by `infos["_final_obs"]` /
`infos["_final_info"]`. Every step is a real transition.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

try:
    import gymnasium
    from gymnasium.spaces import Box, Discrete
    from gymnasium.vector import AutoresetMode
    from gymnasium.vector.utils import batch_space
except ImportError as error:  # the optional extra, or a Gymnasium older than 1.1
    raise ImportError(
        "service.lobsim.gym needs Gymnasium >= 1.1: pip install 'trident[gym]'"
    ) from error

from service.config import LobsimConfig
from service.lobsim.env import NUM_ACTIONS, LobSim, observation_dim


class LobSimGymVectorEnv(gymnasium.vector.VectorEnv):
    """N LobSim markets (service/lobsim/env.py) behind Gymnasium's VectorEnv API.

    Infos carry LobSim's step info (`bce_prev`, `aux_prev`, `inventory`, `pnl`, ...) as [N]
    arrays, each with its `_key` mask: under same-step autoreset the top level describes the
    envs that go on, `final_info` the envs whose episode ended (with `episode_return`).
    Market orders at the inventory limit are masked by LobSim itself (they become HOLD).
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, cfg: LobsimConfig | None = None, seed: int = 0) -> None:
        self.cfg = cfg or LobsimConfig()
        self.num_envs = num_envs
        self.single_observation_space = Box(
            -np.inf, np.inf, (observation_dim(self.cfg),), np.float32
        )
        self.single_action_space = Discrete(NUM_ACTIONS)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.sim = LobSim(num_envs, self.cfg, seed)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """With a seed: fresh markets from that seed. Without one: the current observations
        (LobSim resets its markets itself; `options` has no settings)."""
        super().reset(seed=seed)
        if seed is not None:
            self.sim = LobSim(self.num_envs, self.cfg, seed)
        return self.sim.reset(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        out = self.sim.step(actions)
        done = out.terminated
        step_info = {key: value for key, value in out.info.items() if key != "final_obs"}
        going_on = {key: value for key, value in step_info.items() if key != "episode_return"}
        infos = _masked(going_on, ~done)
        if done.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = out.info["final_obs"][i]
            infos["final_obs"], infos["_final_obs"] = final_obs, done.copy()
            infos["final_info"], infos["_final_info"] = _masked(step_info, done), done.copy()
        return out.obs, out.reward, out.terminated, out.truncated, infos


def _masked(info: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """Gymnasium's vector-info layout: each key beside its `_key` mask of envs it holds for."""
    masked = dict(info)
    for key in info:
        masked[f"_{key}"] = mask.copy()
    return masked
