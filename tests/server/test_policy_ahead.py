"""A rollout whose policy_version is ahead of the server's state is refused FAILED_PRECONDITION,
and its message says what happened: a rollback only where this server's state went back by a
Restore, otherwise that the version is one this state never reached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout, small_config
from prometheus_client import CollectorRegistry

from service.errors import StalePolicy
from service.server.engine import Engine
from service.server.metrics import Metrics
from service.server.status import drop_reason
from service.trainer.trainer import Trainer

WAIT_S = 60


def refusal(engine: Engine, rollout_version: int, rng: np.random.Generator) -> str:
    rollout = random_rollout(rng, policy_version=rollout_version)
    with pytest.raises(StalePolicy) as caught:
        engine.submit_step(rollout, lambda: True).result(WAIT_S)
    assert drop_reason(caught.value) == "ahead"
    return str(caught.value)


def test_ahead_names_a_rollback_only_after_one(tmp_path: Path, rng: np.random.Generator) -> None:
    engine = Engine(
        Trainer(small_config(f"checkpoint.dir={tmp_path}")), Metrics(CollectorRegistry())
    )
    try:
        never = refusal(engine, 1, rng)
        assert "(at step 0): newer than any step this state reached" in never, never
        assert "Restore" not in never and "went back to" not in never
        engine.submit_step(random_rollout(rng), lambda: True).result(WAIT_S)
        engine.checkpoint("one")
        for _ in range(2):
            engine.submit_step(random_rollout(rng), lambda: True).result(WAIT_S)
        engine.restore("one")
        back = refusal(engine, 3, rng)
        assert "(at step 1): a Restore took it back from step 3" in back, back
        beyond = refusal(engine, 4, rng)
        assert "newer than any step this state reached" in beyond, beyond
    finally:
        engine.drain(0)
