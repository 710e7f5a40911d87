"""`trident train --env gymnasium:ID` as a user runs it: the model sized from the env, the run
folder with its log, curve, evaluation and checkpoint; a bare Gymnasium id told how to write
it; `trident serve --env` sizing a server; `trident eval` saying what it evaluates."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import running_server

from service.checkpoint import list_checkpoints, load_policy
from service.client.client import TridentClient
from service.jobs.gym import EVAL_EPISODES, POLICIES

pytestmark = pytest.mark.slow


def trident(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_train_on_a_gymnasium_env(tmp_path: Path) -> None:
    done = trident("train", "--env", "gymnasium:CartPole-v1", "--set", "train.steps=6",
                   "--set", "train.num_envs=4", "--set", "train.rollout_len=16",
                   "--set", "train.log_every=3", "--set", "model.hidden_dim=16",
                   "--run-dir", "run", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("trident train: backend=numpy env=gymnasium:CartPole-v1 steps=6 "
                               "rollout=16x4 obs_dim=4 actions=2")  # fmt: skip
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["3/6", "6/6"]
    run = tmp_path / "run"
    with (run / "train.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert [int(r["env_steps"]) for r in rows] == [64 * k for k in range(1, 7)]
    report = json.loads((run / "eval.json").read_text())
    assert report["env"] == "gymnasium:CartPole-v1" and report["seed"] == 1_000_003
    assert list(report["returns"]) == list(POLICIES)
    assert all(len(v) == EVAL_EPISODES for v in report["episode_returns"].values())
    assert set(report["against_random"]) == {"greedy-π", "sampled-π", "greedy-Q"}
    assert (run / "eval.txt").read_text().startswith("evaluation of gymnasium:CartPole-v1")
    assert (run / "train.png").read_bytes().startswith(b"\x89PNG")
    (saved,) = list_checkpoints(run / "checkpoints")
    config, _ = load_policy(run / "checkpoints", saved.name)
    assert (config.model.obs_dim, config.model.num_actions, config.model.aux_dim) == (4, 2, 0)
    refused = trident("eval", str(saved.path), cwd=tmp_path)
    assert refused.returncode == 2
    assert "expected a LobSim checkpoint: trident eval plays LobSim markets" in refused.stderr
    assert "got a model of obs_dim 4, num_actions 2, aux_dim 0" in refused.stderr


def test_a_bare_gymnasium_id_is_told_how_to_write_it(tmp_path: Path) -> None:
    done = trident("train", "--env", "CartPole-v1", cwd=tmp_path)
    assert done.returncode == 2
    assert "(a Gymnasium env: --env gymnasium:CartPole-v1)" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_serve_takes_its_model_sizes_from_the_env(tmp_path: Path) -> None:
    with (
        running_server(tmp_path, extra_args=("--env", "gymnasium:Acrobot-v1")) as server,
        TridentClient(server.target) as client,
    ):
        model = json.loads(client.status().config_json)["model"]
    assert (model["obs_dim"], model["num_actions"], model["aux_dim"]) == (6, 3, 0)
    clash = trident("serve", "--env", "gymnasium:Acrobot-v1", "--set", "model.obs_dim=7",
                    "--port", "0", "--metrics-port", "0", cwd=tmp_path)  # fmt: skip
    assert clash.returncode == 2
    assert "model.obs_dim: expected 6 for --env gymnasium:Acrobot-v1, got 7" in clash.stderr
