"""The seam across processes in one process: a front end's `LearnerProxy` over a handoff to the
learner's `LearnerHub` serving a real Engine. A request's keyed Step is applied and answered
again from the ledger; what the learner refuses arrives as the same error class; a stream's seat
opens, sizes and closes at the learner; a front end that is gone has its seats closed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout, small_config, wait_until
from prometheus_client import CollectorRegistry

from service.errors import CheckpointNotFound, InvalidInput, KeyReused, StalePolicy
from service.handoff import Handoff, HandoffLimits
from service.server.engine import Engine
from service.server.learner_hub import LearnerHub
from service.server.learner_proxy import LearnerProxy
from service.server.metrics import Metrics
from service.step_ledger import StepKey
from service.trainer.trainer import Trainer
from service.types import ActMode


@pytest.fixture
def split(tmp_path: Path) -> Iterator[tuple[Engine, LearnerProxy]]:
    config = small_config(f"checkpoint.dir={tmp_path}", "server.max_rollout_mb=1",
                          "server.handoff_act_rows=64")  # fmt: skip
    engine = Engine(Trainer(config), Metrics(CollectorRegistry()))
    limits = HandoffLimits.from_config(config.server)
    hub = LearnerHub(engine, limits, front_ends=1)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    hub.hub.adopt(ours)
    handoff = Handoff(theirs, limits.sizes(config.model.obs_dim))
    proxy = LearnerProxy(handoff, config.to_dict()["server"])
    yield engine, proxy
    handoff.close()
    hub.close()
    engine.drain()


def test_calls_answer_as_the_engine_does(
    split: tuple[Engine, LearnerProxy], rng: np.random.Generator
) -> None:
    engine, proxy = split
    assert proxy.config.model == engine.config.model
    rollout = random_rollout(rng)
    first = proxy.submit_step(rollout, lambda: True, StepKey("a", 0), "peer").result(30)
    again = proxy.submit_step(rollout, lambda: True, StepKey("a", 0), "peer").result(30)
    assert (first.global_step, first.replayed, again.replayed) == (1, False, True)
    assert again.losses == first.losses
    with pytest.raises(KeyReused, match="a#0"):
        proxy.submit_step(random_rollout(rng), lambda: True, StepKey("a", 0)).result(30)
    with pytest.raises(StalePolicy, match="policy_version"):
        proxy.submit_step(random_rollout(rng, policy_version=7), lambda: True).result(30)
    acted = proxy.submit_act(rng.standard_normal((4, 6)).astype(np.float32), ActMode.SAMPLE,
                             0.0).result(30)  # fmt: skip
    assert acted.actions.shape == (4,) and acted.policy_version == 1
    info = proxy.checkpoint("one")
    assert (info.name, info.global_step) == ("one", 1)
    assert [c.name for c in proxy.list_checkpoints()] == ["one"]
    with pytest.raises(CheckpointNotFound):
        proxy.restore("none")
    with pytest.raises(InvalidInput) as bad:
        proxy.update_hyperparams({"train.nope": 1.0})
    assert bad.value.field == "hyperparams"
    proxy.update_hyperparams({"train.gamma": 0.9})
    assert proxy.config.train.gamma == 0.9  # read again after the update
    restored, digest = proxy.restore("one")
    assert restored.global_step == 1 and proxy.status().param_digest == digest


def test_a_streams_seat_lives_at_the_learner(
    split: tuple[Engine, LearnerProxy], rng: np.random.Generator
) -> None:
    engine, proxy = split
    seat = proxy.open_seat(6)
    wait_until(lambda: engine.learner.open_streams == 1, 10, "the seat open")
    with seat.waiting():
        pass
    result = seat.submit(random_rollout(rng), lambda: True, StepKey("s", 3)).result(30)
    assert result.global_step == 1
    seat.close()
    wait_until(lambda: engine.learner.open_streams == 0, 10, "the seat closed")
    proxy.open_seat(6)  # left open: the front end's end closes under it
    wait_until(lambda: engine.learner.open_streams == 1, 10, "another seat open")
    proxy.handoff.close()
    wait_until(lambda: engine.learner.open_streams == 0, 10, "a gone front end's seats closed")
