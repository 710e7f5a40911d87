"""`trident actor`: N environments in this process, trained by a remote `trident serve`.

Per env step the actor asks the server's Act (mode sample) for actions on all N observations
and steps the envs; after T steps it sends the time-major rollout [T, N] in one Step, with the
final observations of truncated episodes, the policy version its Act replies named and, for
LobSim, the perception labels.

`--env lobsim` runs LobSim markets (the `lobsim` settings of --config / --set): start the
server with `--set model.obs_dim=<observation_dim(lobsim)> --set model.num_actions=9
--set model.aux_dim=3` (obs_dim is 56 with the default lobsim.visible_levels = 10).
`--env gymnasium:ID` runs `gymnasium.make_vec(ID, num_envs=N, vectorization_mode="sync")` for
any env with Discrete actions and 1-D Box observations (model.obs_dim = the observation size,
model.num_actions = the number of actions; model.aux_dim is free, no aux targets are sent).
The actor reads the server's model shape first and stops with a message on a mismatch.

Its calls go through `ResilientLink` (service/client/resilient.py): when the server goes away
(killed, draining, upgraded) the environments wait where they are, the actor reconnects with
backoff (`--reconnect-timeout`), reads the model shape again, and goes on; every Step carries
an idempotency key, and Steps the server lost with its state are sent again (or dropped and
counted when they are more than train.max_policy_lag versions old).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import grpc
import numpy as np

from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import TridentClient
from service.client.resilient import GONE, ResilientLink
from service.config import LobsimConfig
from service.envs import LobSimVectorEnv
from service.errors import TridentError
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, observation_dim
from service.types import ActMode, ActResult
from service.vector_env import EnvStep, VectorEnv, collect_rollout

if TYPE_CHECKING:  # Gymnasium is optional (pip install 'trident[gym]')
    from gymnasium.vector import VectorEnv as GymnasiumVector

GYMNASIUM = "gymnasium:"


class ActorError(TridentError):
    """The actor cannot run: an unknown or unsupported env, or one the server's model
    does not fit."""


@dataclass(frozen=True)
class EnvDims:
    """What the server's model must match."""

    obs_dim: int
    num_actions: int
    aux_dim: int | None  # None: the env sends no aux targets, any model.aux_dim fits


class ActorEnv(VectorEnv, Protocol):
    """The loop's VectorEnv, keeping the returns of the episodes it finishes."""

    def take_returns(self) -> list[float]:
        """Returns of the episodes finished since the last call."""
        ...


class GymnasiumVectorEnv:
    """A Gymnasium vector env with same-step autoreset as the loop's VectorEnv.

    Same-step autoreset makes every step a real transition: an ended sub-env is reset inside
    the step that ends it, its last observation is `infos["final_obs"][i]`, and the returned
    observation already starts the next episode. (Gymnasium's default next-step mode would
    instead spend the following step on the reset, with reward 0 and the action ignored.)
    """

    def __init__(self, envs: GymnasiumVector, seed: int) -> None:
        import gymnasium

        mode = envs.metadata.get("autoreset_mode")
        if mode != gymnasium.vector.AutoresetMode.SAME_STEP:
            raise ActorError(f"expected a vector env with SAME_STEP autoreset, got {mode}")
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise ActorError(f"the actor needs Discrete actions, got {action_space}")
        if not isinstance(obs_space, gymnasium.spaces.Box) or len(obs_space.shape) != 1:
            raise ActorError(f"the actor needs 1-D Box observations, got {obs_space}")
        self.envs = envs
        self.num_envs = envs.num_envs
        self.dims = EnvDims(obs_space.shape[0], int(action_space.n), None)
        self.action_start = int(action_space.start)  # the server's actions count from 0
        obs, _ = envs.reset(seed=seed)
        self.obs = np.asarray(obs, np.float32)
        self.returns = np.zeros(self.num_envs)
        self.finished_returns: list[float] = []

    def step(self, actions: np.ndarray) -> EnvStep:
        obs, rewards, terminated, truncated, infos = self.envs.step(actions + self.action_start)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated  # a terminal step never bootstraps
        self.returns += rewards
        done = terminated | truncated
        self.finished_returns.extend(self.returns[done].tolist())
        self.returns[done] = 0.0
        final = [np.asarray(infos["final_obs"][i], np.float32) for i in np.flatnonzero(truncated)]
        self.obs = np.asarray(obs, np.float32)
        return EnvStep(
            obs=self.obs,
            rewards=np.asarray(rewards, np.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=np.stack(final) if final else np.zeros((0, self.dims.obs_dim), np.float32),
        )

    def take_returns(self) -> list[float]:
        returns, self.finished_returns = self.finished_returns, []
        return returns


def make_gymnasium_env(env_id: str, num_envs: int, seed: int) -> GymnasiumVectorEnv:
    """`gymnasium.make_vec(env_id)` with sync vectorisation and same-step autoreset."""
    try:
        import gymnasium
    except ImportError as error:
        raise ActorError(f"--env {GYMNASIUM}{env_id} needs pip install 'trident[gym]'") from error
    try:
        envs = gymnasium.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP},
        )
    except gymnasium.error.Error as error:
        raise ActorError(f"--env {GYMNASIUM}{env_id}: {error}") from error
    try:
        return GymnasiumVectorEnv(envs, seed)
    except BaseException:
        envs.close()
        raise


@contextmanager
def open_env(
    env: str, num_envs: int, lobsim: LobsimConfig, seed: int
) -> Iterator[tuple[ActorEnv, EnvDims]]:
    """The vector env `env` names ("lobsim" or "gymnasium:ID") and the model shape it needs."""
    if env == "lobsim":
        dims = EnvDims(observation_dim(lobsim), NUM_ACTIONS, LABEL_DIM)
        yield LobSimVectorEnv(num_envs, lobsim, seed), dims
    elif env.startswith(GYMNASIUM) and env != GYMNASIUM:
        gym_env = make_gymnasium_env(env.removeprefix(GYMNASIUM), num_envs, seed)
        try:
            yield gym_env, gym_env.dims
        finally:
            gym_env.envs.close()
    else:
        raise ActorError(f"--env: expected lobsim or {GYMNASIUM}ID, got {env!r}")


def check_dims(status: pb.GetStatusResponse, dims: EnvDims, env: str) -> None:
    """Stop unless the server trains and its model fits the env."""
    if status.inference_only:
        raise ActorError("the server is inference-only (started from a checkpoint): no Steps")
    model = json.loads(status.config_json)["model"]
    wanted = {"obs_dim": dims.obs_dim, "num_actions": dims.num_actions}
    if dims.aux_dim is not None:
        wanted["aux_dim"] = dims.aux_dim
    wrong = [
        f"model.{k} = {model[k]}, the env needs {v}" for k, v in wanted.items() if model[k] != v
    ]
    if wrong:
        fix = " ".join(f"--set model.{k}={v}" for k, v in wanted.items())
        raise ActorError(
            f"the server's model does not fit --env {env}: {'; '.join(wrong)} "
            f"(start the server with {fix})"
        )


def latency_ms(name: str, seconds: list[float]) -> str:
    """`NAME p50 X ms p99 Y ms` of the wall times `seconds`."""
    if not seconds:
        return f"{name} p50 n/a p99 n/a"
    p50, p99 = np.percentile(np.asarray(seconds) * 1e3, [50, 99])
    return f"{name} p50 {p50:.2f} ms p99 {p99:.2f} ms"


def first_status(
    client: TridentClient, link: ResilientLink, reconnect_s: float
) -> pb.GetStatusResponse:
    """The server's status at the actor's start. An actor may start while its server starts
    or restarts (a fleet and its server deployed together): then it says so on one line and
    waits as through any outage, up to `reconnect_s`."""
    try:
        return client.status()
    except grpc.RpcError as error:
        if error.code() not in GONE:
            raise
        print(
            f"trident actor: no server at {client.target} yet ({error.code().name}); waiting up "
            f"to {reconnect_s:g} s for it (--reconnect-timeout)",
            flush=True,
        )
    return link.status()


def run_actor(
    client: TridentClient,
    env: str,
    lobsim: LobsimConfig,
    *,
    num_envs: int,
    steps: int,
    rollout_len: int,
    seed: int,
    log_every: int,
    duration_s: float | None = None,
    reconnect_s: float = 300.0,
) -> int:
    """Send `steps` Steps of `rollout_len` x `num_envs` env steps (or stop after the first Step
    that ends `duration_s` after the start); print progress, then a `done:` summary line.
    A server gone for longer than `reconnect_s` stops the actor (ServerGone)."""
    for name, value in (
        ("--num-envs", num_envs), ("--steps", steps), ("--rollout-len", rollout_len),
        ("--log-every", log_every),
    ):  # fmt: skip
        if value < 1:
            raise ActorError(f"{name}: expected a positive integer, got {value}")
    if not 0 <= seed < 2**63:
        raise ActorError(f"--seed: expected an integer in [0, 2**63), got {seed}")
    if duration_s is not None and not duration_s > 0:
        raise ActorError(f"--duration: expected a positive number of seconds, got {duration_s}")
    if not reconnect_s > 0:
        raise ActorError(f"--reconnect-timeout: expected a positive number, got {reconnect_s}")
    with open_env(env, num_envs, lobsim, seed) as (vec_env, dims):
        link = ResilientLink(
            client, lambda status: check_dims(status, dims, env), reconnect_s=reconnect_s
        )
        check_dims(first_status(client, link, reconnect_s), dims, env)
        print(
            f"trident actor: env={env} obs_dim={dims.obs_dim} actions={dims.num_actions} "
            f"rollout={rollout_len}x{num_envs} steps={steps} seed={seed} id={link.actor_id}",
            flush=True,
        )
        started = time.perf_counter()
        sent = applied = env_steps = 0
        act_s: list[float] = []
        step_s: list[float] = []

        def act(obs: np.ndarray) -> ActResult:
            called = time.perf_counter()
            result = link.act(obs, ActMode.SAMPLE)
            act_s.append(time.perf_counter() - called)
            return result

        while sent < steps:
            if duration_s is not None and time.perf_counter() - started >= duration_s:
                break
            rollout = collect_rollout(act, vec_env, rollout_len)
            env_steps += rollout_len * num_envs
            called = time.perf_counter()
            reply = link.step(rollout)
            step_s.append(time.perf_counter() - called)
            if reply is None:  # too stale: counted by the link
                continue
            sent += 1
            if reply.updates_applied:
                applied += 1
            if sent % log_every and sent != steps:
                continue
            returns = vec_env.take_returns()
            episodes = f"{np.mean(returns):.2f} ({len(returns)})" if returns else "n/a"
            losses = " ".join(f"{k} {v:.3f}" for k, v in reply.losses.items())
            skipped = f" | skipped: {reply.skip_reason}" if reply.skipped else ""
            print(
                f"step {sent:>5}/{steps} | global step {reply.global_step} | "
                f"{env_steps / (time.perf_counter() - started):7.0f} env steps/s | "
                f"episode return {episodes} | {losses}{skipped}",
                flush=True,
            )
        counts = link.counts
        print(
            f"done: {sent} Steps ({applied} applied, {counts.dropped_stale} dropped as stale), "
            f"{len(act_s)} Acts in {time.perf_counter() - started:.1f} s | "
            f"{latency_ms('Step', step_s)} | {latency_ms('Act', act_s)} | "
            f"{counts.rollouts} rollouts, {counts.resent} resent, {counts.replayed} replayed, "
            f"{counts.reconnects} reconnects, {counts.released} released unconfirmed",
            flush=True,
        )
    return 0
