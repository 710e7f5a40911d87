"""The environments the loops and actors run, as `service/vector_env.py`'s VectorEnv: LobSim,
and any Gymnasium env with Discrete actions (`gymnasium:ID`), by `open_env`; and the settings
an env decides (`fit_to_env`): the model's sizes and the C51 support.

The support comes from a short probe: PROBE_ENVS copies of the env played PROBE_STEPS steps by
a uniformly random policy seeded by train.seed (deterministic). A random policy's returns are not
a trained one's (CartPole's last 20 steps, not 500), so the support also spans what the probe's
per-step rewards give over the discount's horizon 1 / (1 - γ): with r_lo, r_hi the 1st and 99th
percentiles of the rewards of steps that did not end an episode (a terminal bonus is one-off),

    v_min = min(min(0, r_lo) / (1 - γ), lowest discounted return seen)
    v_max = max(max(0, r_hi) / (1 - γ), highest discounted return seen)

each rounded outward to two significant digits: CartPole [0, 100], Acrobot [-100, 0],
LunarLander [-510, 690]. Not LobSim: a random market maker's rewards never show a good one's
profits (its probe gives [-320, 0], which would clip every positive return); its support stays
the recorded default [-10, 10] (docs/benchmarks/learning.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from service.config import C51Config, Config, LobsimConfig, with_overrides
from service.errors import InvalidInput
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, LobSim, observation_dim
from service.vector_env import EnvStep, VectorEnv

if TYPE_CHECKING:  # Gymnasium is optional (pip install 'trident[gym]')
    from gymnasium.vector import VectorEnv as GymnasiumVector

GYMNASIUM = "gymnasium:"


@dataclass(frozen=True)
class EnvDims:
    """The model shape an env needs."""

    obs_dim: int
    num_actions: int
    aux_dim: int | None  # None: the env sends no aux targets, any model.aux_dim fits


class EpisodeEnv(VectorEnv, Protocol):
    """The loop's VectorEnv, keeping the returns of the episodes it finishes."""

    def take_returns(self) -> list[float]:
        """Returns of the episodes finished since the last call."""
        ...


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


class GymnasiumVectorEnv:
    """A Gymnasium vector env with same-step autoreset as the loop's VectorEnv; Box
    observations of any rank are flattened (C order) into [N, prod(shape)] float32.

    Same-step autoreset makes every step a real transition: an ended sub-env is reset inside
    the step that ends it, its last observation is `infos["final_obs"][i]`, and the returned
    observation already starts the next episode. (Gymnasium's default next-step mode would
    instead spend the following step on the reset, with reward 0 and the action ignored.)
    """

    def __init__(self, envs: GymnasiumVector, seed: int) -> None:
        import gymnasium

        mode = envs.metadata.get("autoreset_mode")
        if mode != gymnasium.vector.AutoresetMode.SAME_STEP:
            raise InvalidInput("env", "a vector env with SAME_STEP autoreset", mode)
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise InvalidInput("--env", "an env with Discrete actions", action_space)
        if not isinstance(obs_space, gymnasium.spaces.Box):
            raise InvalidInput("--env", "an env with Box observations (of any rank)", obs_space)
        self.envs = envs
        self.num_envs = envs.num_envs
        self.dims = EnvDims(math.prod(obs_space.shape), int(action_space.n), None)
        self.action_start = int(action_space.start)  # the trainer's actions count from 0
        obs, _ = envs.reset(seed=seed)
        self.obs = self._flat(obs)
        self.returns = np.zeros(self.num_envs)
        self.finished_returns: list[float] = []

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs, np.float32).reshape(len(obs), self.dims.obs_dim)

    def step(self, actions: np.ndarray) -> EnvStep:
        obs, rewards, terminated, truncated, infos = self.envs.step(actions + self.action_start)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated  # a terminal step never bootstraps
        self.returns += rewards
        done = terminated | truncated
        self.finished_returns.extend(self.returns[done].tolist())
        self.returns[done] = 0.0
        final = [infos["final_obs"][i] for i in np.flatnonzero(truncated)]
        self.obs = self._flat(obs)
        return EnvStep(
            obs=self.obs,
            rewards=np.asarray(rewards, np.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=self._flat(np.stack(final)) if final
            else np.zeros((0, self.dims.obs_dim), np.float32),
        )  # fmt: skip

    def take_returns(self) -> list[float]:
        returns, self.finished_returns = self.finished_returns, []
        return returns

    def close(self) -> None:
        self.envs.close()


def make_gymnasium_env(env_id: str, num_envs: int, seed: int) -> GymnasiumVectorEnv:
    """`gymnasium.make_vec(env_id)` with sync vectorisation and same-step autoreset."""
    try:
        import gymnasium
    except ImportError:
        raise InvalidInput("--env", f"{GYMNASIUM}{env_id} with Gymnasium installed (pip install "
                           "'trident[gym]')", "no module gymnasium") from None  # fmt: skip
    try:
        envs = gymnasium.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP},
        )
    except gymnasium.error.Error as error:
        raise InvalidInput("--env", f"a Gymnasium env id ({GYMNASIUM}ID)", f"{env_id}: {error}") \
            from None  # fmt: skip
    try:
        return GymnasiumVectorEnv(envs, seed)
    except BaseException:
        envs.close()
        raise


def env_dims(env: str, lobsim: LobsimConfig) -> EnvDims:
    """The model shape `env` ("lobsim" or "gymnasium:ID") needs (a Gymnasium env is made once
    to read its spaces)."""
    check_env_name(env)
    if env == "lobsim":
        return EnvDims(observation_dim(lobsim), NUM_ACTIONS, LABEL_DIM)
    gym_env = make_gymnasium_env(env.removeprefix(GYMNASIUM), 1, seed=0)
    gym_env.close()
    return gym_env.dims


def check_env_name(env: str) -> None:
    """InvalidInput unless `env` is "lobsim" or "gymnasium:ID"; a bare Gymnasium id is told
    how to write it."""
    if env == "lobsim" or (env.startswith(GYMNASIUM) and env != GYMNASIUM):
        return
    hint = f" (a Gymnasium env: --env {GYMNASIUM}{env})" if "-v" in env else ""
    raise InvalidInput("--env", f"lobsim or {GYMNASIUM}ID", f"{env!r}{hint}")


@contextmanager
def open_env(
    env: str, num_envs: int, lobsim: LobsimConfig, seed: int
) -> Iterator[tuple[EpisodeEnv, EnvDims]]:
    """The vector env `env` names ("lobsim" or "gymnasium:ID") and the model shape it needs."""
    check_env_name(env)
    if env == "lobsim":
        yield LobSimVectorEnv(num_envs, lobsim, seed), env_dims(env, lobsim)
        return
    gym_env = make_gymnasium_env(env.removeprefix(GYMNASIUM), num_envs, seed)
    try:
        yield gym_env, gym_env.dims
    finally:
        gym_env.close()


PROBE_ENVS = 16  # copies of the env the support probe plays
PROBE_STEPS = 256  # steps each copy plays
HOST_NUM_ENVS = 256  # train.num_envs of a Gymnasium env left at 0, on every backend


def fit_to_env(config: Config, env: str) -> Config:
    """`config` with the settings `env` decides: model.obs_dim, num_actions and aux_dim (a value
    set otherwise that disagrees is refused, naming it); for a Gymnasium env c51.v_min / v_max
    from the probe where both are left at their defaults, and a train.num_envs left at 0 set
    to HOST_NUM_ENVS (its envs run on the host; a GPU's thousands would spend a budget of
    env steps in a few Steps)."""
    dims = env_dims(env, config.lobsim)
    sizes = {"obs_dim": dims.obs_dim, "num_actions": dims.num_actions,
             "aux_dim": dims.aux_dim or 0}  # fmt: skip
    defaults = Config().model
    for key, wanted in sizes.items():
        given = getattr(config.model, key)
        if given not in (wanted, getattr(defaults, key)):
            raise InvalidInput(f"model.{key}", f"{wanted} for --env {env}", given)
    settings = [f"model.{key}={value}" for key, value in sizes.items()]
    if env == "lobsim":
        return with_overrides(config, settings)
    c51, default_c51 = config.c51, C51Config()
    if (c51.v_min, c51.v_max) == (default_c51.v_min, default_c51.v_max):
        v_min, v_max = probe_support(env, config)
        settings += [f"c51.v_min={v_min!r}", f"c51.v_max={v_max!r}"]
    if config.train.num_envs == 0:
        settings.append(f"train.num_envs={HOST_NUM_ENVS}")
    return with_overrides(config, settings)


def probe_support(env: str, config: Config) -> tuple[float, float]:
    """[v_min, v_max] for the C51 head from a random policy's play of `env` (see above)."""
    seed = config.train.seed
    rng = np.random.default_rng(seed)
    rewards = np.empty((PROBE_STEPS, PROBE_ENVS))
    terminated, ended = np.empty_like(rewards, bool), np.empty_like(rewards, bool)
    with open_env(env, PROBE_ENVS, config.lobsim, seed) as (vec_env, dims):
        for t in range(PROBE_STEPS):
            out = vec_env.step(rng.integers(0, dims.num_actions, PROBE_ENVS))
            rewards[t], terminated[t] = out.rewards, out.terminated
            ended[t] = out.terminated | out.truncated
    return support_from_play(rewards, terminated, ended, config.train.gamma)


def support_from_play(
    rewards: np.ndarray, terminated: np.ndarray, ended: np.ndarray, gamma: float
) -> tuple[float, float]:
    """The probe's rule on [T, N] rewards and episode ends (module docstring)."""
    horizon = 1 / (1 - gamma) if gamma < 1 else len(rewards)
    flow = rewards[~terminated] if (~terminated).any() else rewards
    low_rate, high_rate = np.percentile(flow, [1, 99])
    returns, ahead = np.empty_like(rewards), np.zeros(rewards.shape[1])
    for t in range(len(rewards) - 1, -1, -1):  # discounted returns-to-go within the probe
        ahead = rewards[t] + gamma * np.where(ended[t], 0.0, ahead)
        returns[t] = ahead
    v_min = min(min(0.0, low_rate) * horizon, returns.min())
    v_max = max(max(0.0, high_rate) * horizon, returns.max())
    if not v_max - v_min > 1e-6:  # rewards all 0: any support fits; keep the default's width
        default = C51Config()
        v_min, v_max = v_min + default.v_min, v_max + default.v_max
    return _round_out(v_min, floor=True), _round_out(v_max, floor=False)


def _round_out(value: float, floor: bool) -> float:
    """`value` rounded away from the inside of the support to two significant digits."""
    value = float(f"{value:.9g}")  # 1 / (1 - 0.99) is 100.00000000000001
    if value == 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(abs(value))) - 1)
    return float((math.floor if floor else math.ceil)(value / unit) * unit)
