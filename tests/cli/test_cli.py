"""`trident train` as a user runs it: a real process, its output, its checkpoint, its errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from safetensors.numpy import load_file

from service.checkpoint import list_checkpoints
from service.jobs.run_folder import disk_bytes, megabytes


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
    done = trident("train", "--env", "bandit", "--config", "small.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("trident train: backend=numpy")
    # the default run folder, printed at the start: runs/<env>-<UTC time>
    (run,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"bandit-\d{8}-\d{6}", run.name)
    assert lines[1].startswith(f"run folder {Path('runs', run.name)}: config.toml")
    assert (run / "config.toml").is_file()
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/6", "4/6", "6/6"]
    assert all("greedy-π" in line and "samples/s" in line for line in progress)
    assert "done: 6 steps, 192 samples" in done.stdout
    (saved,) = list_checkpoints(run / "checkpoints")
    assert saved.global_step == 6 and saved.name in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "small.toml"]


def test_train_on_lobsim_compares_with_the_baselines(tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text(
        '[model]\nhidden_dim = 32\n[train]\nbackend = "numpy"\nsteps = 4\nlog_every = 2\n'
        "num_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
        "[lobsim]\nhorizon = 6\n"
    )
    done = trident("train", "--config", "small.toml", "--run-dir", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("trident train: backend=numpy env=lobsim")
    assert lines[1].startswith("run folder run: config.toml, train.csv, train.png, eval.json")
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/4", "4/4"]
    assert all("env steps/s" in line and "episode return" in line for line in progress)
    assert "\r" not in done.stdout  # no progress bar outside a terminal
    (header,) = [line for line in lines if line.startswith("evaluation: ")]
    assert header.startswith("evaluation: 256 held-out markets, seed 1000003;")
    policies = ("trained (greedy-π)", "hold", "random", "quote(0,0)", "inventory-skew",
                "avellaneda-stoikov")  # fmt: skip
    for policy in policies:  # its metrics row first; a baseline's paired row follows
        row = next(line for line in lines if line.startswith(policy))
        assert row.count("±") + row.count("n/a") == 8, row
    (verdict,) = [line for line in lines if line.startswith("verdict (256 held-out markets, "
                                                            "seed 1000003): the trained agent")]
    assert "the best baseline" in verdict
    run = tmp_path / "run"
    saved_eval = json.loads((run / "eval.json").read_text())
    assert saved_eval["seed"] == 1_000_003 and saved_eval["verdict"] == verdict
    assert (run / "eval.txt").read_text().splitlines()[-1] == verdict
    assert (run / "eval.png").read_bytes().startswith(b"\x89PNG")
    (saved,) = list_checkpoints(run / "checkpoints")
    assert saved.global_step == 4
    # Training is done: its checkpoint leaves out the replay buffer, and the run says its size.
    replay = load_file(saved.path / "replay.safetensors")
    assert int(replay["size"][0]) == 0 and replay["obs"].shape[0] == 0
    assert lines[-1] == (f"run folder run: {megabytes(disk_bytes(run))} (checkpoints: "
                         f"{megabytes(disk_bytes(run / 'checkpoints'))} in 1; a finished run's "
                         "last one leaves out the replay buffer, which resuming it does not "
                         "need)"), lines[-1]  # fmt: skip
    assert (run / "train.png").read_bytes().startswith(b"\x89PNG")
    log = (run / "train.csv").read_text().splitlines()
    assert log[0].startswith("step,elapsed_s")
    assert [row.split(",")[0] for row in log[1:]] == list("1234")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "small.toml"]
    # --resume: the run's newest checkpoint, then the Steps left up to train.steps
    resumed = trident(
        "train", "--config", "small.toml", "--run-dir", "run", "--set", "train.steps=6",
        "--resume", cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {saved.name} at step 4" in resumed.stdout
    log = (run / "train.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == list("123456")
    assert max(c.global_step for c in list_checkpoints(run / "checkpoints")) == 6
    # From the empty replay it refilled at once (32 transitions a Step): the C51 head trains.
    assert re.search(r"^step 6/6 .*\| q [\d.]+ pi ", resumed.stdout, re.M), resumed.stdout
    # an explicit checkpoint.dir wins over the run folder's
    elsewhere = trident(
        "train", "--config", "small.toml", "--run-dir", "run2", "--set", "checkpoint.dir=ckpt",
        "--resume", cwd=tmp_path,
    )  # fmt: skip
    assert elsewhere.returncode == 2 and "a checkpoint in ckpt" in elsewhere.stderr


def test_bad_setting_fails_naming_the_key(tmp_path: Path) -> None:
    done = trident("train", "--set", "ppo.clip_eps=-1", cwd=tmp_path)
    assert done.returncode == 2
    assert "ppo.clip_eps" in done.stderr and "-1" in done.stderr
    assert not list(tmp_path.iterdir())


def test_resume_needs_the_run_to_continue(tmp_path: Path) -> None:
    done = trident("train", "--resume", cwd=tmp_path)
    assert done.returncode == 2 and "--resume: expected --run-dir" in done.stderr
    assert not list(tmp_path.iterdir())


def test_the_bandit_job_stops_on_sigint_with_a_checkpoint_and_no_traceback(
    tmp_path: Path,
) -> None:
    (tmp_path / "small.toml").write_text(
        '[model]\nobs_dim = 12\nhidden_dim = 16\n[train]\nbackend = "numpy"\nsteps = 100000\n'
        "log_every = 1\nnum_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
        "[checkpoint]\nevery_steps = 2\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "train", "--env", "bandit", "--config",
         "small.toml", "--run-dir", "run"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 3/"):
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err == "", err
    last = out.splitlines()[-1]
    assert last.startswith("trident train: stopped by SIGINT at step "), last
    assert "; checkpoint step-" in last
    step = int(last.split(" at step ")[1].split("/")[0])
    assert list_checkpoints(tmp_path / "run" / "checkpoints")[0].global_step == step
