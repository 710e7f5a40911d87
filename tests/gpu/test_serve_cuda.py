"""`trident serve --backend cuda`: a real server process on the GPU, over a real channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import random_rollout, running_server

from service.backend.cuda.loader import KERNEL_ABI_VERSION
from service.client.client import TridentClient
from service.types import ActMode


def test_serve_backend_cuda(tmp_path: Path, rng: np.random.Generator) -> None:
    with (
        running_server(tmp_path, extra_args=("--backend", "cuda")) as server,
        TridentClient(server.target) as client,
    ):
        status = client.status()
        assert status.backend == "cuda" and status.device and status.device != "cpu"
        assert status.kernel_abi_version == KERNEL_ABI_VERSION
        replies = [client.step(random_rollout(rng)) for _ in range(3)]
        assert [r.global_step for r in replies] == [1, 2, 3]
        assert all(r.updates_applied > 0 and not r.skipped for r in replies)
        obs = rng.standard_normal((64, 6)).astype(np.float32)
        acted = client.act(obs, ActMode.GREEDY_Q)
        assert acted.actions.shape == (64,) and acted.policy_version == 3
        saved = client.checkpoint("on-gpu")
        assert saved.global_step == 3
        assert client.restore("on-gpu").param_digest == client.status().param_digest
    # The with-block's SIGTERM drained the GPU server: a final checkpoint, then exit 0.
    assert server.proc.returncode == 0, server.stderr()[-2000:]
    assert [e["step"] for e in server.events("final checkpoint")] == [3]
