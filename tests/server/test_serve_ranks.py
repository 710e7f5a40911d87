"""`trident serve --world-size 2` on the NumPy backend: two rank processes behind one gRPC
server train like one trainer holding both shards (float32, 1e-5 relative), Act answers from
rank 0, a checkpoint gathers both ranks' replay and restores into one trainer, and SIGTERM
stops every rank with exit 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout, running_server, small_config

from service.checkpoint import load_policy, restore_checkpoint
from service.client.client import TridentClient
from service.testing.serverproc import trident_cli
from service.trainer.trainer import Trainer
from service.types import ActMode


def test_two_ranks_serve_like_one_trainer(tmp_path: Path, rng: np.random.Generator,
                                          seed: int) -> None:  # fmt: skip
    settings = ("train.data_shards=2", f"train.seed={seed}", "replay.capacity=512")
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(6)]
    obs = rng.standard_normal((16, 6)).astype(np.float32)
    single = Trainer(small_config(*settings))
    expected = [single.step(rollout) for rollout in rollouts]
    server = running_server(tmp_path, *settings, extra_args=["--world-size", "2"])
    with server, TridentClient(server.target) as client:
        replies = [client.step(rollout) for rollout in rollouts]
        acted = client.act(obs, ActMode.GREEDY_PI)
        client.checkpoint("ranked")
        assert client.status().global_step == len(rollouts)
    assert server.terminate() == 0
    assert [e["world_size"] for e in server.events("ranks")] == [2]
    for reply, want in zip(replies, expected, strict=True):
        assert reply.losses.keys() == want.losses.keys()
        for head, loss in want.losses.items():
            assert reply.losses[head] == pytest.approx(loss, rel=1e-4, abs=1e-5), head
    _, params = load_policy(server.checkpoint_dir, "ranked")
    mine = single.state_dict()
    for name, array in params.items():  # float32: each tensor within 1e-5 relative
        want = mine[f"params/{name}"]
        assert np.linalg.norm(array - want) <= 1e-5 * np.linalg.norm(want) + 1e-7, name
    np.testing.assert_array_equal(acted.actions, single.act(obs, ActMode.GREEDY_PI).actions)
    restored = Trainer(small_config(*settings))
    restore_checkpoint(restored, server.checkpoint_dir, "ranked")
    assert restored.global_step == 6 and len(restored.state.replay) == len(single.state.replay)


def test_a_world_size_the_shards_do_not_divide_stops_before_binding(tmp_path: Path) -> None:
    done = trident_cli("serve", "--port", "0", "--metrics-port", "0", "--world-size", "2",
                       cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert "train.data_shards = 1 must be a multiple of server.world_size = 2" in done.stderr


def test_a_single_trainers_checkpoint_restores_onto_two_ranks(
    tmp_path: Path, rng: np.random.Generator, seed: int
) -> None:
    """Any world size restores a checkpoint: one trainer's (both shards) onto a 2-rank server
    that then trains like the trainer going on (float32, 1e-5 per tensor)."""
    from service.checkpoint import save_checkpoint

    settings = ("train.data_shards=2", f"train.seed={seed}", "replay.capacity=512")
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(6)]
    single = Trainer(small_config(*settings))
    for rollout in rollouts[:3]:
        single.step(rollout)
    checkpoints = tmp_path / "checkpoints"
    save_checkpoint(single, checkpoints, "single")
    for rollout in rollouts[3:]:
        single.step(rollout)
    server = running_server(tmp_path, *settings, checkpoint_dir=checkpoints,
                            extra_args=["--world-size", "2", "--restore", "single"])  # fmt: skip
    with server, TridentClient(server.target) as client:
        assert client.status().global_step == 3
        for rollout in rollouts[3:]:
            client.step(rollout)
        client.checkpoint("after")
    assert server.terminate() == 0
    _, params = load_policy(checkpoints, "after")
    mine = single.state_dict()
    for name, array in params.items():
        want = mine[f"params/{name}"]
        assert np.linalg.norm(array - want) <= 1e-5 * np.linalg.norm(want) + 1e-7, name
