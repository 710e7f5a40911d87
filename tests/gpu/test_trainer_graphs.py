"""Captured CUDA graphs of Step and Act against the same kernels launched one by one."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_rollout, random_steps

from service.trainer.trainer import Trainer
from service.types import ActMode
from tests.gpu.test_trainer_cuda import trainer

STEPS = 6  # the first Step of a shape runs eagerly, the second captures, the rest replay


def state_bytes(t: Trainer) -> dict[str, bytes]:
    return {name: array.tobytes() for name, array in t.state_dict().items()}


def assert_same_results(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        assert (g.updates_applied, g.updates_skipped) == (w.updates_applied, w.updates_skipped)
        assert g.losses == w.losses  # the same bits, read back from the same kernels
        assert (g.grad_norm, g.entropy, g.approx_kl) == (w.grad_norm, w.entropy, w.approx_kl)
        assert g.skip_reason == w.skip_reason


def test_graph_replay_equals_eager_launches(seed: int, rng: np.random.Generator) -> None:
    graphed, eager = trainer("cuda"), trainer("cuda", "train.cuda_graphs=false")
    got, want = random_steps(graphed, seed, STEPS), random_steps(eager, seed, STEPS)
    # The first Step fills the replay (no Q head yet); the later ones share one shape.
    step_graphs = graphed.executor.captures
    assert step_graphs == 1 and eager.executor.captures == 0, step_graphs
    assert all("q" in r.losses for r in want[-3:])
    assert_same_results(got, want)
    assert state_bytes(graphed) == state_bytes(eager)
    obs = rng.standard_normal((37, 6)).astype(np.float32)
    for _ in range(3):  # eager, captured, replayed
        for mode in ActMode:
            g, w = graphed.act(obs, mode, 0.25), eager.act(obs, mode, 0.25)
            for name in ("actions", "log_probs", "values"):
                assert getattr(g, name).tobytes() == getattr(w, name).tobytes(), (mode, name)
    assert graphed.executor.captures == step_graphs + len(ActMode)
    assert eager.executor.captures == 0


def test_update_hyperparams_reaches_the_graph_without_recapture(rng: np.random.Generator) -> None:
    graphed, eager = trainer("cuda"), trainer("cuda", "train.cuda_graphs=false")
    rollouts = [random_rollout(rng) for _ in range(STEPS)]
    changes = {"optim.lr": 3e-3, "train.gamma": 0.9, "ppo.clip_eps": 0.1, "c51.target_tau": 0.5}
    for t in (graphed, eager):
        for rollout in rollouts[:4]:
            t.step(rollout)
    captures = graphed.executor.captures
    before = state_bytes(graphed)
    for t in (graphed, eager):
        t.update_hyperparams(changes)
    got = [graphed.step(r) for r in rollouts[4:]]
    want = [eager.step(r) for r in rollouts[4:]]
    assert graphed.executor.captures == captures  # nothing re-captured
    assert_same_results(got, want)
    after = state_bytes(graphed)
    assert after == state_bytes(eager)
    assert after["params/q/W"] != before["params/q/W"]


def test_non_finite_update_inside_the_graph_changes_no_parameter(
    rng: np.random.Generator,
) -> None:
    import cupy

    t = trainer("cuda")
    for _ in range(4):
        t.step(random_rollout(rng))
    assert t.executor.captures == 1  # the next Step replays a graph
    t.state.replay.storage["next_obs"][...] = np.nan  # every target-network input: a NaN Q loss
    cupy.cuda.Device().synchronize()  # that fill ran on another stream
    names = ("params/", "target/", "optim/")
    before = {k: v for k, v in state_bytes(t).items() if k.startswith(names)}
    result = t.step(random_rollout(rng))
    assert t.executor.captures == 1
    epochs, minibatches = t.config.ppo.epochs, t.config.ppo.num_minibatches
    assert result.updates_applied == 0 and result.updates_skipped == epochs * minibatches
    assert result.skip_reason == "non-finite loss of q; update not applied"
    assert {k: v for k, v in state_bytes(t).items() if k.startswith(names)} == before


@pytest.mark.parametrize("B", [256, 1000])
def test_captured_update_trains(B: int) -> None:
    """bench/gpu_step.py's CapturedUpdate: every replay applies a full update, fresh draws."""
    import cupy

    from bench.captured_update import CapturedUpdate
    from service.config import load_config
    from service.trainer.update import APPLIED

    overrides = [
        f"replay.capacity={4 * B}",
        f"replay.batch_size={B}",
        f"replay.min_size={B}",
        "ppo.num_minibatches=1",
        "c51.target_tau=0.01",  # Polyak: the target moves every update
    ]
    update = CapturedUpdate(load_config(env={}, overrides=overrides), B, seed=B)
    before = {k: v.tobytes() for k, v in update.trainer.state_dict().items()}
    sequence = int(update.trainer.state.sequences["updates_attempted"][0])
    for _ in range(3):
        update.run()
    cupy.cuda.get_current_stream().synchronize()
    totals = cupy.asnumpy(update.totals)
    assert totals[APPLIED] == 1 and np.isfinite(totals).all()
    assert int(update.trainer.state.sequences["updates_attempted"][0]) == sequence + 3
    after = update.trainer.state_dict()
    for name in ("params/q/W", "params/encoder/W0", "target/q/W", "optim/exp_avg/pi/W"):
        assert after[name].tobytes() != before[name], name
