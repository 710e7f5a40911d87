"""Acting never waits for learning: Acts are answered from the published snapshot while a Step
holds the trainer, report the snapshot's version, and trident_act_duration_seconds times the
batched forward alone."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from conftest import random_rollout, small_config, wait_until
from prometheus_client import CollectorRegistry

from service.config import Config
from service.server.engine import Engine
from service.server.metrics import Metrics
from service.trainer.snapshot import PolicySnapshot
from service.trainer.trainer import Trainer
from service.types import ActMode, ActResult, Rollout, StepResult

STEP_S = 100.0  # what a Step takes on the test's clock
FORWARD_S = 0.25  # what an Act forward takes on it
ROWS = 3  # observations per Act request
WAIT_S = 30.0


class Clock:
    """A clock that moves only when told, so the durations the engine measures are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedSnapshot(PolicySnapshot):
    """A snapshot whose forward takes FORWARD_S of the clock."""

    clock: Clock

    def act_rows(self, parts: list[np.ndarray], mode: ActMode, epsilon: float) -> ActResult:
        self.clock.now += FORWARD_S
        return super().act_rows(parts, mode, epsilon)


class HeldTrainer(Trainer):
    """A trainer whose Step holds it until `release` is set and takes STEP_S of the clock."""

    def __init__(self, config: Config, clock: Clock) -> None:
        super().__init__(config)
        self.clock = clock
        self.stepping, self.release = threading.Event(), threading.Event()

    def step(self, rollout: Rollout, finite: bool = False) -> StepResult:
        self.stepping.set()
        assert self.release.wait(WAIT_S), "the test never let the Step finish"
        self.clock.now += STEP_S
        return super().step(rollout, finite)

    def snapshot(self) -> PolicySnapshot:
        snapshot = TimedSnapshot(self.state, self.backend.executor(False, True), self.executor)
        snapshot.clock = self.clock
        return snapshot


def test_acts_are_answered_while_a_step_holds_the_trainer(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    # One batch is two requests: the first waits in the queue until the second joins it.
    config = small_config(
        f"checkpoint.dir={tmp_path}",
        f"server.act_max_batch={2 * ROWS}",
        "server.act_max_wait_ms=60000",
    )
    clock, registry = Clock(), CollectorRegistry()
    trainer = HeldTrainer(config, clock)
    twin = Trainer(config)  # the same seed: what the live trainer answers, Act for Act
    engine = Engine(trainer, Metrics(registry), clock=clock)
    rollout = random_rollout(rng)
    step = engine.submit_step(rollout, lambda: True)
    assert trainer.stepping.wait(WAIT_S), "the Step never started"

    obs = rng.standard_normal((2, ROWS, config.model.obs_dim)).astype(np.float32)
    answers: dict[int, ActResult] = {}

    def act(i: int) -> None:
        answers[i] = engine.submit_act(obs[i], ActMode.SAMPLE, 0.0).result(WAIT_S)

    actors = [threading.Thread(target=act, args=(i,)) for i in range(2)]
    actors[0].start()
    wait_until(lambda: engine.act_queue_depth == 1, WAIT_S, "the first Act request queued")
    actors[1].start()
    wait_until(lambda: len(answers) == 2, WAIT_S, "both Acts answered while the Step is held")
    assert not step.done()
    assert {answer.policy_version for answer in answers.values()} == {0}
    before = twin.act(obs.reshape(2 * ROWS, -1))  # one batch of both requests' rows, in order
    np.testing.assert_array_equal(np.concatenate([answers[0].actions, answers[1].actions]),
                                  before.actions)  # fmt: skip

    trainer.release.set()
    assert step.result(WAIT_S).global_step == 1
    twin.step(rollout)
    both = obs.reshape(2 * ROWS, -1)  # a full batch: answered without waiting for more
    after = engine.submit_act(both, ActMode.SAMPLE, 0.0).result(WAIT_S)
    live = twin.act(both)
    assert after.policy_version == live.policy_version == 1
    np.testing.assert_array_equal(after.actions, live.actions)
    assert after.log_probs.tobytes() == live.log_probs.tobytes()
    assert after.values.tobytes() == live.values.tobytes()
    engine.drain()

    assert registry.get_sample_value("trident_act_batch_size_sum") == 4 * ROWS
    assert registry.get_sample_value("trident_act_duration_seconds_count") == 2
    assert registry.get_sample_value("trident_act_duration_seconds_sum") == 2 * FORWARD_S
    # The clock is shared: the first batch's forward ran inside the held Step's time.
    assert registry.get_sample_value("trident_step_duration_seconds_sum") == STEP_S + FORWARD_S
