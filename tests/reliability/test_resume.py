"""Resume equality: 2k Steps straight == k Steps, checkpoint, SIGKILL, restart with --restore,
k more Steps, down to the last byte of every checkpointed tensor (params, target, optimizer
moments and step counts, counters, RNG seed, replay buffer)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
from conftest import random_rollout, running_server
from serverproc import ServerProcess

from service.checkpoint import read_manifest
from service.client.client import TridentClient
from service.types import Rollout

K = 3
SETTINGS = ("train.seed=1234", "replay.capacity=512")


def run_steps(server: ServerProcess, rollouts: list[Rollout]) -> list[int]:
    """Step each rollout in order; the replies' global steps."""
    with TridentClient(server.target) as client:
        return [client.step(rollout).global_step for rollout in rollouts]


def save_and_status(server: ServerProcess, name: str) -> tuple[Path, str, int]:
    """Checkpoint `name`; its directory, the GetStatus digest and global step."""
    with TridentClient(server.target) as client:
        info = client.checkpoint(name)
        status = client.status()
    return server.checkpoint_dir / info.name, status.param_digest, status.global_step


def test_resume_after_sigkill_is_bit_identical(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rollouts = [random_rollout(rng, T=4, N=4) for _ in range(2 * K)]

    # Both servers start together (startup is most of the cost); A runs 2k Steps straight.
    a = running_server(tmp_path / "a", *SETTINGS)
    b = running_server(tmp_path / "b", *SETTINGS)
    try:
        assert run_steps(a, rollouts) == list(range(1, 2 * K + 1))
        a_dir, a_digest, a_step = save_and_status(a, "end")
        assert run_steps(b, rollouts[:K]) == list(range(1, K + 1))
        save_and_status(b, "mid")
        b.proc.send_signal(signal.SIGKILL)
        assert b.proc.wait(30) == -signal.SIGKILL
    finally:
        a.terminate()
        b.terminate()
    assert not b.events("final checkpoint")  # killed: nothing ran after the kill

    resumed = running_server(
        tmp_path / "b2", *SETTINGS, checkpoint_dir=b.checkpoint_dir, extra_args=["--restore", "mid"]
    )
    try:
        assert resumed.events("restore")[0]["step"] == K
        assert run_steps(resumed, rollouts[K:]) == list(range(K + 1, 2 * K + 1))
        b_dir, b_digest, b_step = save_and_status(resumed, "end")
    finally:
        resumed.terminate()

    assert (a_step, b_step) == (2 * K, 2 * K)
    assert a_digest == b_digest
    a_manifest, b_manifest = read_manifest(a_dir), read_manifest(b_dir)
    assert a_manifest["param_digest"] == b_manifest["param_digest"] == a_digest
    assert a_manifest["global_step"] == b_manifest["global_step"] == 2 * K
    a_files = sorted(p.name for p in a_dir.iterdir())
    assert a_files == sorted(p.name for p in b_dir.iterdir())
    groups = {name.removesuffix(".safetensors") for name in a_files if name.endswith("safetensors")}
    assert {"params", "target", "optim", "replay", "counters", "rng"} <= groups
    for name in a_files:
        if name.endswith(".safetensors"):
            assert (a_dir / name).read_bytes() == (b_dir / name).read_bytes(), name
            assert a_manifest["files"][name] == b_manifest["files"][name], name
    # config.json differs only in checkpoint.dir (each server's own); manifest.json in its
    # created_unix, its config.json hash and its seal.
    a_config, b_config = (json.loads((d / "config.json").read_text()) for d in (a_dir, b_dir))
    assert Path(a_config["checkpoint"].pop("dir")) == a_dir.parent
    assert Path(b_config["checkpoint"].pop("dir")) == b_dir.parent
    assert a_config == b_config and a_config["train"]["seed"] == 1234
