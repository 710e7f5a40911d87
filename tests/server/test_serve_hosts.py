"""Ranks on several hosts (here: two processes that share nothing but a TCP port): `trident
serve` with TRIDENT_RANK=1 connects to rank 0 at TRIDENT_RENDEZVOUS and runs its commands;
rank 0 serves gRPC and trains with it like one trainer holding both shards (float32, 1e-5 per
tensor). SIGTERM to both, rank 1 first as Kubernetes would: rank 1 waits for rank 0, whose
final checkpoint gathers rank 1's replay ring over the link, then both exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import SERVING, SMALL, free_port, random_rollout, small_config

from service.checkpoint import list_checkpoints, load_policy, restore_checkpoint
from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess, clean_env
from service.trainer.trainer import Trainer


def test_two_hosts_train_like_one_trainer(tmp_path: Path, rng: np.random.Generator,
                                          seed: int) -> None:  # fmt: skip
    settings = ("train.data_shards=2", f"train.seed={seed}", "replay.capacity=512")
    rollouts = [random_rollout(rng, T=5, N=8) for _ in range(5)]
    place = {"TRIDENT_WORLD_SIZE": "2", "TRIDENT_RENDEZVOUS": f"127.0.0.1:{free_port()}"}
    sets = [arg for setting in (*SMALL, *SERVING, *settings) for arg in ("--set", setting)]
    command = [sys.executable, "-m", "service.cli", "serve", "--port", "0", "--metrics-port", "0",
               *sets]  # fmt: skip
    other = subprocess.Popen(command, cwd=tmp_path, env={**clean_env(), **place,
                             "TRIDENT_RANK": "1"}, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        server = ServerProcess.start(tmp_path / "rank0", [*SMALL, *SERVING, *settings],
                                     env={**place, "TRIDENT_RANK": "0"})  # fmt: skip
        with server:
            with TridentClient(server.target) as client:
                for rollout in rollouts:
                    client.step(rollout)
                assert client.status().global_step == len(rollouts)
            other.send_signal(signal.SIGTERM)  # as Kubernetes stops every pod: rank 1 waits for 0
            assert server.terminate() == 0, server.stderr()[-3000:]
        _, err = other.communicate(timeout=60)
    finally:
        other.kill()
    assert other.returncode == 0, err[-3000:]
    assert "rank joined" in err and "rank stopped" in err
    single = Trainer(small_config(*settings))
    for rollout in rollouts:
        single.step(rollout)
    (final,) = [c for c in list_checkpoints(server.checkpoint_dir) if c.name.startswith("final-")]
    _, params = load_policy(server.checkpoint_dir, final.name)
    mine = single.state_dict()
    for name, array in params.items():
        want = mine[f"params/{name}"]
        assert np.linalg.norm(array - want) <= 1e-5 * np.linalg.norm(want) + 1e-7, name
    restored = Trainer(small_config(*settings))
    restore_checkpoint(restored, server.checkpoint_dir, final.name)
    assert len(restored.state.replay) == len(single.state.replay)  # both rings gathered
