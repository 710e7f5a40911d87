"""Kickstarting (`[kickstart]`): its settings refused with a message naming the setting, its
weight a function of the global step (so a resumed trainer trains as one that never stopped),
the LobSim job's teacher the inventory-skew rule, and its pull on the greedy policy. The loss's
gradient against autograd is tests/backend/test_ops_grad.py's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout, small_config

from service.config import ConfigError, kickstart_weight, load_config
from service.jobs.train import lobsim_model
from service.lobsim.baselines import skew_actions
from service.lobsim.env import feature_column
from service.trainer import update
from service.trainer.trainer import Trainer
from service.types import ActMode

ON = ("kickstart.coef=0.5", "kickstart.decay_steps=4", "kickstart.feature=2")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("kickstart.coef=1", "kickstart.decay_steps=0"),
         "kickstart.decay_steps = 0 must be >= 1 where kickstart.coef = 1.0 > 0"),
        (("kickstart.coef=1", "kickstart.decay_steps=5", "kickstart.feature=6"),
         "kickstart.feature = 6 must be < model.obs_dim = 6"),
        (("kickstart.coef=1", "kickstart.decay_steps=5", "kickstart.feature=0",
          "kickstart.action_above=9"),
         "kickstart.action_above = 9 must be < model.num_actions = 9"),
        (("kickstart.coef=-0.1",), "kickstart.coef = -0.1 is out of range; must be >= 0"),
        (("kickstart.feature=-2",), "kickstart.feature = -2 is out of range; must be >= -1"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_setting(
    settings: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        small_config(*settings)


def test_off_settings_are_not_checked() -> None:
    """coef 0 (the default) is off: its other settings may be anything in range."""
    small_config("kickstart.feature=60", "kickstart.action_zero=40")


def test_a_trainer_without_a_feature_is_refused() -> None:
    config = small_config("kickstart.coef=1", "kickstart.decay_steps=5")
    with pytest.raises(ConfigError, match=r"kickstart\.feature = -1: expected the observation"):
        Trainer(config)


def test_the_weight_falls_linearly_to_zero() -> None:
    kick = small_config(*ON).kickstart
    assert [kickstart_weight(kick, g) for g in range(6)] == [0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
    assert kickstart_weight(small_config().kickstart, 0) == 0.0


def test_each_step_reads_its_weight_and_a_resumed_trainer_goes_on_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The weight each Step's updates read follows the global step; a trainer restored from
    another's state after 3 Steps reads the weights and ends with the parameters of one that
    never stopped."""
    read: list[float] = []
    kickstart = update.Updates._on_policy_heads

    def recording(self: update.Updates, *args: object) -> object:
        read.append(self.state.hp[update.KICKSTART])
        return kickstart(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(update.Updates, "_on_policy_heads", recording)
    rollouts = [random_rollout(np.random.default_rng(7)) for _ in range(6)]
    straight = Trainer(small_config(*ON))
    for rollout in rollouts:
        straight.step(rollout)
    per_step = len(read) // 6  # epochs × minibatches
    assert read == [w for w in (0.5, 0.375, 0.25, 0.125, 0.0, 0.0) for _ in range(per_step)]

    first = Trainer(small_config(*ON))
    for rollout in rollouts[:3]:
        first.step(rollout)
    resumed = Trainer(small_config(*ON))
    resumed.load_state_dict(first.state_dict())
    read.clear()
    for rollout in rollouts[3:]:
        resumed.step(rollout)
    assert read == [w for w in (0.125, 0.0, 0.0) for _ in range(per_step)]
    assert resumed.param_digest() == straight.param_digest()


def test_off_trains_as_before() -> None:
    """coef 0 leaves the Step as it was: the same parameters whatever the teacher's settings."""
    digests = []
    for settings in [(), ("kickstart.feature=2", "kickstart.action_zero=7")]:
        trainer = Trainer(small_config(*settings))
        trainer.step(random_rollout(np.random.default_rng(3)))
        digests.append(trainer.param_digest())
    assert digests[0] == digests[1]


def test_the_teacher_pulls_the_greedy_policy_to_its_actions() -> None:
    """With advantages that teach nothing (zero rewards) and a large weight, the greedy policy
    takes the teacher's action for each sign of the feature."""
    trainer = Trainer(small_config("kickstart.coef=5", "kickstart.decay_steps=1000",
                                   "kickstart.feature=0", "ppo.ent_coef=0"))  # fmt: skip
    rng = np.random.default_rng(11)
    for _ in range(80):
        rollout = random_rollout(rng, extras=False)
        rollout.obs[..., 0] = rng.choice([-1.0, 0.0, 1.0], size=rollout.obs.shape[:-1])
        rollout.rewards[...] = 0.0
        trainer.step(rollout)
    obs = rng.normal(size=(300, 6)).astype(np.float32)
    obs[:, 0] = np.repeat([-0.5, 0.0, 2.0], 100)
    actions = trainer.act(obs, ActMode.GREEDY_PI).actions
    assert (actions == np.repeat([5, 2, 6], 100)).mean() > 0.95


def test_the_lobsim_jobs_teacher_is_the_inventory_skew_rule(tmp_path: Path) -> None:
    """The LobSim job fills in the inventory column; the default actions are `skew_actions`'
    for a short, a flat and a long inventory; an explicit column is kept."""
    config = lobsim_model(load_config(env={}, overrides=["kickstart.coef=1",
                                                         "kickstart.decay_steps=10"]))  # fmt: skip
    kick = config.kickstart
    assert kick.feature == feature_column(config.lobsim, "inventory")
    teacher = [kick.action_below, kick.action_zero, kick.action_above]
    assert teacher == skew_actions(np.array([-3, 0, 2])).tolist()
    kept = lobsim_model(load_config(env={}, overrides=["kickstart.feature=3"]))
    assert kept.kickstart.feature == 3
