"""The learning rate over a run (service/trainer/schedule.py): the linear schedule against its
formula, and a served trainer annealing over its train.steps as the in-process jobs do, its
base rate set by UpdateHyperparams, the end of the schedule told in the Step reply."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout, running_server

from service.client.client import TridentClient
from service.config import load_config
from service.trainer.schedule import COOLDOWN, ended, learning_rate


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


@pytest.mark.slow
def test_a_served_trainer_anneals_over_its_steps(tmp_path: Path, rng: np.random.Generator) -> None:
    with (
        running_server(tmp_path, "train.steps=4", "optim.lr=0.001") as server,
        TridentClient(server.target) as client,
    ):

        def rate() -> float:
            return json.loads(client.status().config_json)["optim"]["lr"]

        assert rate() == 0.001
        rates, warnings = [], []
        for _ in range(2):
            reply = client.step(random_rollout(rng))
            rates.append(rate())  # the rate that Step ran at
            warnings += reply.warnings
        # UpdateHyperparams sets the base rate; the schedule scales it from the Step it is at
        config = json.loads(client.update_hyperparams({"optim.lr": 0.002}))
        assert config["optim"]["lr"] == pytest.approx(0.002 * 2 / 4)
        for _ in range(3):
            reply = client.step(random_rollout(rng))
            rates.append(rate())
            warnings += reply.warnings
        assert reply.global_step == 5
    assert rates == pytest.approx([0.001, 0.001 * 3 / 4, 0.002 * 2 / 4, 0.002 / 4, 0.002 / 4])
    told = [w for w in warnings if w.startswith("lr_schedule: ")]
    assert len(told) == 1 and "train.steps = 4" in told[0]
