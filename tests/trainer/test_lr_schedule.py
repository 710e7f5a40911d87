"""The learning rate over a run (service/trainer/schedule.py): the linear schedule against its
formula, a served trainer annealing over its train.steps as the in-process jobs do, its base
rate set by UpdateHyperparams, the end of the schedule told in the Step reply; a server without
train.steps training at a constant rate; status and metrics saying where the schedule stands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout, running_server, small_config

from service.client.client import TridentClient
from service.config import load_config
from service.testing.serverproc import scrape, value
from service.trainer.schedule import COOLDOWN, ended, learning_rate, schedule_next_step, where
from service.trainer.trainer import Trainer


def test_the_linear_rate_is_the_base_times_what_is_left(rng: np.random.Generator) -> None:
    steps = int(rng.integers(2, 1000))
    base = float(rng.uniform(1e-4, 1e-2))
    train = load_config(env={}, overrides=[f"train.steps={steps}"]).train
    for done in rng.integers(0, steps, 20):
        assert learning_rate(train, base, int(done)) == pytest.approx(base * (steps - done) / steps)
    assert learning_rate(train, base, steps - 1) == pytest.approx(base / steps)
    past = steps + int(rng.integers(0, 50))
    assert learning_rate(train, base, past) == pytest.approx(base / steps)  # not 0: the backend's
    constant = load_config(env={}, overrides=[f"train.steps={steps}",
                                              "train.lr_schedule=constant"]).train  # fmt: skip
    assert learning_rate(constant, base, steps + 7) == base


def test_the_end_is_told_on_the_first_step_past_it_then_every_cooldown() -> None:
    train = load_config(env={}, overrides=["train.steps=10"]).train
    told = [step for step in range(1, 10 + 3 * COOLDOWN) if ended(train, step)]
    assert told == [11, 11 + COOLDOWN, 11 + 2 * COOLDOWN]
    message = ended(train, 11)
    assert message is not None and message.startswith("lr_schedule: ")
    assert "train.steps = 10" in message
    constant = load_config(env={}, overrides=["train.steps=10", "train.lr_schedule=constant"])
    assert ended(constant.train, 11) is None


def test_a_run_without_steps_trains_at_its_base_rate(rng: np.random.Generator) -> None:
    train = load_config(env={}, overrides=["train.lr_schedule=linear"]).train
    assert train.steps == 0
    base = float(rng.uniform(1e-4, 1e-2))
    for done in rng.integers(0, 10**9, 20):
        assert learning_rate(train, base, int(done)) == base
        assert ended(train, int(done)) is None
    assert where(train, 7) == "constant: no train.steps, a run with no end"
    scheduled = load_config(env={}, overrides=["train.steps=20"]).train
    assert where(scheduled, 7) == "linear over 20 Steps: 7 done, 13 to go"
    assert where(scheduled, 20) == "linear over 20 Steps: ended, at its last rate"


@pytest.mark.parametrize("steps", [0, 4])
def test_status_and_metrics_show_the_rate_and_the_schedule(
    tmp_path: Path, rng: np.random.Generator, steps: int
) -> None:
    """Three Steps on a server with train.steps = 4 or none: after each, `trident status` and
    the metrics give the rate the next Step trains at and where the schedule stands."""
    base = float(rng.uniform(1e-4, 1e-2))
    settings = (f"train.steps={steps}", f"optim.lr={base!r}", "train.lr_schedule=linear")
    with running_server(tmp_path, *settings) as server, TridentClient(server.target) as client:
        for done in range(1, 4):
            client.step(random_rollout(rng))
            status = client.status()
            metrics = scrape(server)
            if steps:
                assert status.learning_rate == pytest.approx(base * (steps - done) / steps)
                assert status.lr_schedule == f"linear over 4 Steps: {done} done, {4 - done} to go"
            else:
                assert status.learning_rate == base
                assert status.lr_schedule == "constant: no train.steps, a run with no end"
            assert value(metrics, "trident_learning_rate") == pytest.approx(status.learning_rate)
            assert value(metrics, "trident_lr_schedule_steps") == steps


@pytest.mark.slow
def test_a_served_trainer_anneals_over_its_steps(tmp_path: Path, seed: int) -> None:
    """Five Steps on a server with train.steps = 4, the base rate changed after two: each Step's
    rate, the end told once, and the parameters those of a Trainer given the same Steps with
    `schedule_next_step` before each (what the train jobs do)."""
    settings = ("train.steps=4", "optim.lr=0.001", "train.lr_schedule=linear")
    rng = np.random.default_rng(seed)
    rollouts = [random_rollout(rng) for _ in range(5)]
    with (
        running_server(tmp_path, *settings) as server,
        TridentClient(server.target) as client,
    ):

        def rate() -> float:
            return json.loads(client.status().config_json)["optim"]["lr"]

        assert rate() == 0.001
        rates, warnings = [], []
        for k, rollout in enumerate(rollouts):
            if k == 2:  # UpdateHyperparams sets the base; the schedule scales it from here
                config = json.loads(client.update_hyperparams({"optim.lr": 0.002}))
                assert config["optim"]["lr"] == pytest.approx(0.002 * 2 / 4)
            reply = client.step(rollout)
            rates.append(rate())  # the rate that Step ran at
            warnings += reply.warnings
        assert reply.global_step == 5
        served = client.status().param_digest
    assert rates == pytest.approx([0.001, 0.001 * 3 / 4, 0.002 * 2 / 4, 0.002 / 4, 0.002 / 4])
    told = [w for w in warnings if w.startswith("lr_schedule: ")]
    assert len(told) == 1 and "train.steps = 4" in told[0]
    local = Trainer(small_config(*settings))
    for k, rollout in enumerate(rollouts):
        schedule_next_step(local, 0.001 if k < 2 else 0.002)
        local.step(rollout)
    assert local.param_digest() == served
