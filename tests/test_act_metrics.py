"""trident_act_duration_seconds times the batched Act forward, not the wait for a Step."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from conftest import small_config
from prometheus_client import CollectorRegistry

from service.server.engine import Engine
from service.server.metrics import Metrics
from service.trainer.trainer import Trainer
from service.types import ActMode

HELD_S = 0.5  # how long the test holds the trainer, as a Step in progress would


def test_act_duration_excludes_the_wait_for_the_trainer(tmp_path: Path) -> None:
    config = small_config(f"checkpoint.dir={tmp_path}")
    registry = CollectorRegistry()
    engine = Engine(Trainer(config), Metrics(registry))
    obs = np.random.default_rng().standard_normal((5, config.model.obs_dim)).astype(np.float32)
    engine.act(obs, ActMode.SAMPLE, 0.0)  # first call: imports and warm-up, not timed here
    before = registry.get_sample_value("trident_act_duration_seconds_sum")

    engine._lock.acquire()  # a Step holds the trainer
    try:
        started = time.perf_counter()
        actor = threading.Thread(target=lambda: engine.act(obs, ActMode.SAMPLE, 0.0))
        actor.start()
        time.sleep(HELD_S)
    finally:
        engine._lock.release()
    actor.join(10)
    waited = time.perf_counter() - started
    engine._acts.close()

    assert registry.get_sample_value("trident_act_duration_seconds_count") == 2
    forward_s = registry.get_sample_value("trident_act_duration_seconds_sum") - before
    assert waited >= HELD_S  # the caller did wait for the trainer ...
    assert 0 < forward_s < HELD_S / 2  # ... but the histogram holds the forward alone
