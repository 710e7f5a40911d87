"""`trident train` as a user runs it: a real process, its output, its checkpoint, its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from service.checkpoint import list_checkpoints


def trident(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_prints_progress_and_writes_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text(
        '[model]\nobs_dim = 12\nhidden_dim = 32\n[train]\nbackend = "numpy"\nsteps = 6\n'
        "log_every = 2\nnum_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
    )
    done = trident(
        "train", "--env", "bandit", "--config", "small.toml", "--set", "checkpoint.dir=ckpt",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("trident train: backend=numpy")
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/6", "4/6", "6/6"]
    assert all("greedy-π" in line and "samples/s" in line for line in progress)
    assert "done: 6 steps, 192 samples" in done.stdout
    (saved,) = list_checkpoints(tmp_path / "ckpt")
    assert saved.global_step == 6 and saved.name in done.stdout


def test_train_on_lobsim_compares_with_the_baselines(tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text(
        '[model]\nhidden_dim = 32\n[train]\nbackend = "numpy"\nsteps = 4\nlog_every = 2\n'
        "num_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
        "[lobsim]\nhorizon = 6\n"
    )
    done = trident("train", "--config", "small.toml", "--set", "checkpoint.dir=ckpt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("trident train: backend=numpy env=lobsim")
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/4", "4/4"]
    assert all("env steps/s" in line and "episode return" in line for line in progress)
    (header,) = [line for line in lines if line.startswith("evaluation: ")]
    assert header.startswith("evaluation: 256 held-out markets, seed 1000003;")
    policies = ("trained (greedy-π)", "hold", "random", "quote(0,0)", "inventory-skew",
                "avellaneda-stoikov")  # fmt: skip
    for policy in policies:  # its metrics row first; a baseline's paired row follows
        row = next(line for line in lines if line.startswith(policy))
        assert row.count("±") + row.count("n/a") == 8, row
    (verdict,) = [line for line in lines if line.startswith("verdict: the best baseline is ")]
    assert "the trained agent" in verdict
    saved_eval = json.loads((tmp_path / "trident_eval" / "eval.json").read_text())
    assert saved_eval["seed"] == 1_000_003 and saved_eval["verdict"] == verdict
    assert (tmp_path / "trident_eval" / "eval.png").read_bytes().startswith(b"\x89PNG")
    (saved,) = list_checkpoints(tmp_path / "ckpt")
    assert saved.global_step == 4
    assert (tmp_path / "trident_train.png").read_bytes().startswith(b"\x89PNG")
    log = (tmp_path / "trident_train.csv").read_text().splitlines()
    assert log[0].startswith("step,elapsed_s")
    assert [row.split(",")[0] for row in log[1:]] == list("1234")
    # --resume: the newest checkpoint, then the Steps left up to train.steps
    resumed = trident(
        "train", "--config", "small.toml", "--set", "checkpoint.dir=ckpt",
        "--set", "train.steps=6", "--resume", cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {saved.name} at step 4" in resumed.stdout
    log = (tmp_path / "trident_train.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == list("123456")
    assert max(c.global_step for c in list_checkpoints(tmp_path / "ckpt")) == 6


def test_bad_setting_fails_naming_the_key(tmp_path: Path) -> None:
    done = trident("train", "--set", "ppo.clip_eps=-1", cwd=tmp_path)
    assert done.returncode == 2
    assert "ppo.clip_eps" in done.stderr and "-1" in done.stderr
    assert not (tmp_path / "checkpoints").exists()
