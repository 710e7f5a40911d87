"""trident_act_duration_seconds times the batched Act forward, not the wait for a Step."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from conftest import random_rollout, small_config, wait_until
from prometheus_client import CollectorRegistry

from service.config import Config
from service.server.engine import Engine
from service.server.metrics import Metrics
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


class HeldTrainer(Trainer):
    """A trainer whose Step holds it until `release` is set and takes STEP_S of the clock; a
    forward takes FORWARD_S."""

    def __init__(self, config: Config, clock: Clock) -> None:
        super().__init__(config)
        self.clock = clock
        self.stepping, self.release = threading.Event(), threading.Event()

    def step(self, rollout: Rollout) -> StepResult:
        self.stepping.set()
        assert self.release.wait(WAIT_S), "the test never let the Step finish"
        self.clock.now += STEP_S
        return super().step(rollout)

    def act(
        self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE, epsilon: float = 0.0
    ) -> ActResult:
        self.clock.now += FORWARD_S
        return super().act(obs, mode, epsilon)


def test_act_duration_excludes_the_wait_for_the_trainer(
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
    engine = Engine(trainer, Metrics(registry), clock=clock)
    step = engine.submit_step(random_rollout(rng), lambda: True)
    assert trainer.stepping.wait(WAIT_S), "the Step never started"

    obs = rng.standard_normal((ROWS, config.model.obs_dim)).astype(np.float32)
    actors = [threading.Thread(target=engine.act, args=(obs, ActMode.SAMPLE, 0.0)) for _ in "ab"]
    actors[0].start()
    wait_until(lambda: engine.act_queue_depth == 1, WAIT_S, "the first Act request queued")
    actors[1].start()
    # The batch is full and taken: its forward waits for the Step holding the trainer.
    wait_until(lambda: engine.act_queue_depth == 0, WAIT_S, "the Act batch taken")
    trainer.release.set()
    for actor in actors:
        actor.join(WAIT_S)
    assert step.result(WAIT_S).global_step == 1
    engine.drain()

    assert registry.get_sample_value("trident_act_batch_size_sum") == 2 * ROWS
    assert registry.get_sample_value("trident_act_duration_seconds_count") == 1
    assert registry.get_sample_value("trident_act_duration_seconds_sum") == FORWARD_S
    assert registry.get_sample_value("trident_step_duration_seconds_sum") == STEP_S
