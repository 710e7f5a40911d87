"""A server left running as deployed keeps its work: the deployment's settings (no train.steps,
periodic checkpoints by time, `checkpoint.resume` as the image sets it through its
environment), an actor with no --steps, a SIGKILL, and the same command started again. The
restarted server carries on from its newest periodic checkpoint, and what the kill lost is the
Steps after it: all applied within one period of it (`checkpoint.every_s`, shortened here from
the deployment's 300 s so the test sees several)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, wait_until

from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess, clean_env

pytestmark = pytest.mark.slow

PERIOD_S = 1.0
CARTPOLE = ("model.obs_dim=4", "model.num_actions=2", "model.aux_dim=0", "train.num_envs=8")
# What the image and the manifests set, as environment variables (deploy/Dockerfile).
DEPLOYED = {"TRIDENT_CHECKPOINT__RESUME": "true", "TRIDENT_CHECKPOINT__EVERY_S": str(PERIOD_S)}
EVERY_STEP = {"TRIDENT_SERVER__LOG_LEVEL": "DEBUG"}  # each Step's own line: what a kill lost


def serve(tmp_path: Path, life: int, port: int) -> ServerProcess:
    return ServerProcess.start(
        tmp_path / f"life-{life}",
        list(CARTPOLE),
        checkpoint_dir=tmp_path / "checkpoints",
        extra_args=["--port", str(port)],
        env={**DEPLOYED, **EVERY_STEP},
    )


def periodic(server: ServerProcess) -> list[dict]:
    return [e for e in server.events("checkpoint") if e["name"].startswith("step-")]


def test_a_killed_server_restarts_from_its_last_period(tmp_path: Path) -> None:
    port = free_port()
    server = serve(tmp_path, 0, port)
    actor = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "actor", "--server", server.target, "--env",
         "gymnasium:CartPole-v1", "--num-envs", "8", "--rollout-len", "8", "--log-every",
         "1000", "--reconnect-timeout", "120"],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Two periodic checkpoints, and Steps past the newest
        wait_until(lambda: len(periodic(server)) >= 2, 120, "two periodic checkpoints")
        newest = periodic(server)[-1]["step"]
        wait_until(lambda: server.events("step")[-1]["global_step"] > newest + 2, 60,
                   "Steps past the newest checkpoint")  # fmt: skip
        server.proc.send_signal(signal.SIGKILL)
        assert server.proc.wait(30) == -signal.SIGKILL
        steps = server.events("step")
        saved = periodic(server)
        reached = steps[-1]["global_step"]

        restarted = serve(tmp_path, 1, port)
        try:
            (resumed,) = restarted.events("restore")
            with TridentClient(restarted.target) as client:
                status = client.status()
            # the actor goes on against the restarted server: its run has no end
            wait_until(lambda: restarted.events("step"), 60, "a Step after the restart")
            actor.send_signal(signal.SIGINT)
            out, err = actor.communicate(timeout=60)
        finally:
            assert restarted.terminate() == 0, restarted.stderr()[-3000:]
    finally:
        actor.kill()
        server.terminate()
    # Carried on from the newest committed checkpoint, not from 0
    assert resumed["step"] == saved[-1]["step"] > 0
    assert resumed["name"] == saved[-1]["name"]
    assert status.lr_schedule == "constant: no train.steps, a run with no end"
    # What the kill lost: the Steps after that checkpoint, applied within a period of it (a
    # checkpoint follows the first Step that ends a period; the bound allows that Step's own
    # time, and the last Step's checkpoint may be the one the kill cut short)
    lost = [s for s in steps if s["global_step"] > resumed["step"]]
    assert [s["global_step"] for s in lost] == list(range(resumed["step"] + 1, reached + 1))
    assert all(s["ts"] - saved[-1]["ts"] < 2 * PERIOD_S for s in lost[:-1]), (lost, saved[-1])
    # Periodic checkpoints came a period apart, not a Step count apart
    gaps = [b["ts"] - a["ts"] for a, b in itertools.pairwise(saved)]
    assert all(gap >= PERIOD_S * 0.9 for gap in gaps), gaps
    assert actor.returncode == 130, err[-3000:]
    header = out.splitlines()[0]
    assert "until stopped (the server's run has no end: no train.steps)" in header, out[:500]
