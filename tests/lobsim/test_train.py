"""The integrated loop on the CPU: Act -> LobSim -> Step, within a fixed budget and seed."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from service.config import load_config
from service.lobsim.train import run_train_lobsim


def test_smoke_losses_fall_and_the_agent_beats_random(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(
        env={},
        overrides=[
            "train.backend=numpy",
            "train.seed=5",
            "train.steps=40",
            "train.log_every=20",
            "train.num_envs=16",
            "train.rollout_len=8",
            "model.hidden_dim=64",
            "replay.min_size=128",
            "replay.batch_size=64",
            "lobsim.horizon=40",
            f"checkpoint.dir={tmp_path / 'ckpt'}",
        ],
    )
    log = tmp_path / "log.csv"
    assert run_train_lobsim(config, False, log_csv=log, curve_png=tmp_path / "c.png") == 0
    out = capsys.readouterr().out
    rows = list(csv.DictReader(log.open()))
    q = [float(r["loss_q"]) for r in rows if r["loss_q"]]
    assert np.mean(q[-5:]) < np.mean(q[:5]), q  # the C51 loss falls
    returns = {
        line[:20].strip(): float(line[20:].split("±")[0])
        for line in out.splitlines()
        if "±" in line and not line.startswith("policy")
    }
    print(returns)
    assert returns["trained (greedy-π)"] > returns["random"]
    assert "the trained agent beats the random baseline" in out
