"""Resume equality: 2k Steps straight == k Steps, checkpoint, SIGKILL, restart with --restore,
k more Steps, down to the last byte of every checkpointed tensor (params, target, optimizer
moments and step counts, counters, RNG seed, replay buffer)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
from conftest import random_rollout, running_server

from service.checkpoint import read_manifest
from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess
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


def test_a_rollback_then_a_kill_resumes_the_line_after_the_rollback(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """An operator rolls back from step 8 to step 4, the server trains and saves the new
    line's step 6 (`step-0000000006-<ms>`: the name was taken), and is SIGKILLed: `--resume`
    restores that checkpoint, committed last, not the abandoned line's step 8."""
    checkpoints = tmp_path / "checkpoints"
    settings = (*SETTINGS, "checkpoint.every_steps=2", "checkpoint.keep_last=10")
    with running_server(tmp_path / "first", *settings, checkpoint_dir=checkpoints) as server:
        run_steps(server, [random_rollout(rng) for _ in range(8)])
        with TridentClient(server.target) as client:
            client.restore("step-0000000004")
        assert run_steps(server, [random_rollout(rng) for _ in range(2)]) == [5, 6]
        with TridentClient(server.target) as client:
            listed = client.list_checkpoints()
            status = client.status()
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
    newest = listed[0]
    assert newest.global_step == 6 and newest.name.startswith("step-0000000006-"), listed
    assert [c.name for c in listed[1:3]] == ["step-0000000008", "step-0000000006"]
    assert [c.commit_sequence for c in listed] == sorted(
        (c.commit_sequence for c in listed), reverse=True)  # fmt: skip
    second = running_server(tmp_path / "second", *settings, checkpoint_dir=checkpoints,
                            extra_args=["--resume"])  # fmt: skip
    with second, TridentClient(second.target) as client:
        resumed = client.status()
        relisted = [c.name for c in client.list_checkpoints()]
    assert (resumed.global_step, resumed.param_digest) == (6, status.param_digest)
    assert relisted == [c.name for c in listed]
