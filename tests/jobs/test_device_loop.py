"""The device loop (service/jobs/device_loop.py) on NumPy: the same Steps as the host loop,
and the device rollout's guard. The GPU run is tests/gpu/test_device_loop.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from service.config import Config, load_config
from service.envs import LobSimVectorEnv
from service.errors import InvalidInput
from service.jobs.device_loop import DeviceLoop
from service.jobs.train import lobsim_model
from service.lobsim.env import LobSim
from service.trainer.replay import FIELDS
from service.trainer.trainer import Trainer
from service.types import ActMode, DeviceRollout
from service.vector_env import collect_rollout

T, N = 5, 6


def lobsim_config(seed: int) -> Config:
    return lobsim_model(
        load_config(
            env={},
            overrides=[
                "train.backend=numpy",
                f"train.seed={seed}",
                "model.hidden_dim=32",
                "replay.min_size=16",
                "replay.batch_size=16",
                "ppo.num_minibatches=2",
                "lobsim.horizon=7",  # episodes end inside the rollouts
            ],
        )
    )


def test_device_loop_makes_the_host_loops_steps(seed: int) -> None:
    config = lobsim_config(seed)
    host_trainer, device_trainer = Trainer(config), Trainer(config)
    host_env = LobSimVectorEnv(N, config.lobsim, seed)
    loop = DeviceLoop(device_trainer, LobSim(N, config.lobsim, seed), T)
    episodes = 0
    for _ in range(4):
        rollout = collect_rollout(lambda o: host_trainer.act(o, ActMode.SAMPLE), host_env, T)
        expected = host_trainer.step(rollout)
        ended = host_env.take_returns()
        got = loop.step()
        np.testing.assert_array_equal(loop.actions, rollout.actions)
        np.testing.assert_array_equal(loop.obs, rollout.obs)
        np.testing.assert_allclose(loop.rewards, rollout.rewards)
        assert got.episodes == len(ended)
        assert got.return_sum == pytest.approx(sum(ended), rel=1e-6, abs=1e-6)
        assert got.mean_reward == pytest.approx(float(rollout.rewards.mean()), rel=1e-6, abs=1e-9)
        assert got.result.global_step == expected.global_step
        assert got.result.losses.keys() == expected.losses.keys()
        for head, loss in expected.losses.items():
            assert got.result.losses[head] == pytest.approx(loss, rel=1e-4, abs=1e-6), head
        episodes += len(ended)
    assert episodes > 0  # the final observations were exercised
    for name, value in host_trainer.state.params.items():
        np.testing.assert_allclose(device_trainer.state.params[name], value, rtol=1e-4, atol=1e-6)
    stored, expected = device_trainer.state.replay.storage, host_trainer.state.replay.storage
    # A terminated transition never bootstraps: its next_obs is the episode's true final
    # observation here and the next episode's first in the host loop (which gets no final
    # observations for terminations); every other row is the same.
    live = expected["dones"] == 0
    assert (~live).any()
    np.testing.assert_array_equal(stored["next_obs"][live], expected["next_obs"][live])
    for name in FIELDS:
        if name != "next_obs":
            np.testing.assert_array_equal(stored[name], expected[name], err_msg=name)


def collected(config: Config, seed: int) -> tuple[Trainer, DeviceRollout]:
    """A trainer, and a copy of the device rollout its loop last collected."""
    trainer = Trainer(config)
    loop = DeviceLoop(trainer, LobSim(N, config.lobsim, seed), T)
    loop.step()
    rollout = DeviceRollout(
        obs=loop.obs.copy(),
        next_obs=loop.next_obs.copy(),
        actions=loop.actions.copy(),
        rewards=loop.rewards.copy(),
        terminated=loop.terminated.copy(),
        truncated=loop.truncated.copy(),
        behavior_log_probs=loop.log_probs.copy(),
        bce_labels=loop.bce_labels.copy(),
        aux_targets=loop.aux_targets.copy(),
    )
    return trainer, rollout


def spoiled(rollout: DeviceRollout, field: str, rng: np.random.Generator) -> DeviceRollout:
    array = getattr(rollout, field).copy()
    index = tuple(int(rng.integers(n)) for n in array.shape)
    array[index] = {"actions": 9, "obs": np.nan, "next_obs": np.inf}.get(field, -np.inf)
    return replace(rollout, **{field: array})


@pytest.mark.parametrize(
    "field", ["rewards", "obs", "next_obs", "behavior_log_probs", "aux_targets", "actions"]
)
def test_bad_value_on_the_device_skips_the_whole_step(
    field: str, seed: int, rng: np.random.Generator
) -> None:
    trainer, rollout = collected(lobsim_config(seed), seed)
    digest, step, size = trainer.param_digest(), trainer.global_step, len(trainer.state.replay)
    stored = {name: trainer.state.replay.storage[name].copy() for name in FIELDS}
    result, report = trainer.step_on_device(spoiled(rollout, field, rng), np.array([1.5, -2.0]))
    assert result.skipped and result.updates_applied == 0
    assert "Step not applied" in result.skip_reason
    np.testing.assert_array_equal(report, [1.5, -2.0])  # the report still comes back
    assert (trainer.param_digest(), trainer.global_step) == (digest, step)
    assert len(trainer.state.replay) == size
    for name in FIELDS:
        np.testing.assert_array_equal(trainer.state.replay.storage[name], stored[name])
    result, _ = trainer.step_on_device(rollout)  # the good rollout still applies
    assert not result.skipped and result.global_step == step + 1
    assert len(trainer.state.replay) == size + T * N


@pytest.mark.parametrize(
    "field, bad",
    [
        ("obs", lambda a: a[:-1]),
        ("next_obs", lambda a: a[..., :-1]),
        ("rewards", lambda a: a.astype(np.int32)),
        ("terminated", lambda a: a.astype(np.uint8)),
        ("aux_targets", lambda a: a[..., :1]),
        ("actions", lambda a: a.astype(np.float32)),
    ],
)
def test_wrong_shape_or_dtype_is_rejected_without_change(field: str, bad, seed: int) -> None:
    trainer, rollout = collected(lobsim_config(seed), seed)
    digest, size = trainer.param_digest(), len(trainer.state.replay)
    with pytest.raises(InvalidInput) as error:
        trainer.step_on_device(replace(rollout, **{field: bad(getattr(rollout, field))}))
    assert error.value.field == field
    assert (trainer.param_digest(), len(trainer.state.replay)) == (digest, size)


def test_act_on_device_checks_shape_and_dtype(rng: np.random.Generator) -> None:
    trainer = Trainer(lobsim_config(3))
    obs = rng.standard_normal((4, trainer.config.model.obs_dim))
    with pytest.raises(InvalidInput, match="obs"):
        trainer.act_on_device(obs[:, 1:].astype(np.float32))
    with pytest.raises(InvalidInput, match="dtype"):
        trainer.act_on_device(obs)  # float64
