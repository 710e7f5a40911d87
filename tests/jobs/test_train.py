"""The main job on the CPU: its run folder, its learning curve, its lr schedule. That the
default job beats the baselines is checked where the README runs it
(tests/project/test_readme.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from service.config import load_config
from service.config_sizes import BACKEND_DEFAULTS
from service.jobs import evaluate
from service.jobs.run_folder import RunFolder
from service.jobs.train import (
    CSV_COLUMNS,
    HELD_OUT,
    lobsim_model,
    make_stepper,
    plot_learning_curve,
    run_train_lobsim,
    smoothed,
)
from service.trainer.schedule import schedule_next_step
from service.trainer.trainer import Trainer
from tests.jobs.test_scalars import read_events

SEED = 0
MARKETS = 64  # held-out markets of the verdict


def test_the_job_fills_its_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Config, CSV, learning curve, evaluation (JSON, text, PNG) and checkpoints land in the
    run folder; the TensorBoard directory holds every CSV scalar at every Step."""
    config = load_config(
        env={},
        overrides=[
            "train.backend=numpy",
            "train.seed=5",
            "train.steps=4",
            "train.log_every=2",
            "train.num_envs=16",
            "train.rollout_len=8",
            "replay.min_size=64",
            "lobsim.horizon=20",
        ],
    )
    run = tmp_path / "run"
    assert run_train_lobsim(config, run, True, tensorboard=tmp_path / "tb") == 0
    out = capsys.readouterr().out
    folder = RunFolder(run)
    used = load_config(folder.config, env={})
    assert used.checkpoint.dir == "" and used.train.seed == 5  # defaulted: a rerun uses its own
    assert used.train.lr_schedule == "linear" and used.model.obs_dim == 56  # sized for LobSim
    rows = list(csv.DictReader(folder.log_csv.open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    lr = BACKEND_DEFAULTS["numpy"]["optim.lr"]  # optim.lr = 0: the backend's, linearly annealed
    assert [float(r["lr"]) for r in rows] == pytest.approx([lr, 0.75 * lr, 0.5 * lr, 0.25 * lr])
    assert all(np.isfinite(float(r["loss_pi"])) for r in rows)
    assert folder.curve_png.read_bytes().startswith(b"\x89PNG")
    report = json.loads((run / evaluate.JSON_NAME).read_text())
    assert report["seed"] == 5 + HELD_OUT and report["markets"] == evaluate.EVAL_MARKETS
    assert "trained (greedy-π)" in report["policies"] and "hold" in report["paired"]
    assert (run / evaluate.PNG_NAME).read_bytes().startswith(b"\x89PNG")
    text = (run / evaluate.TEXT_NAME).read_text()
    assert text.rstrip().endswith(report["verdict"]) and text.rstrip() in out
    assert report["verdict"].startswith(f"verdict ({evaluate.EVAL_MARKETS} held-out markets, "
                                        f"seed {5 + HELD_OUT}):")  # fmt: skip
    assert f"run folder {run}:" in out
    assert list(folder.checkpoints.iterdir())  # the final checkpoint
    events = read_events(tmp_path / "tb")
    for column in CSV_COLUMNS[1:]:
        logged = [(int(r["step"]), float(r[column])) for r in rows if r[column]]
        assert [step for step, _ in events[f"train/{column}"]] == [s for s, _ in logged]
        assert [v for _, v in events[f"train/{column}"]] == pytest.approx(
            [v for _, v in logged], rel=1e-5
        )


def test_the_smoothed_curve_averages_one_window() -> None:
    values = np.array([4.0, -2.0, 7.0, 1.0, 0.5])
    window = 3
    expected = [values[max(0, i - window + 1) : i + 1].mean() for i in range(values.size)]
    assert smoothed(values, window) == pytest.approx(expected)
    assert smoothed(values, 1) == pytest.approx(values)


SMALL_JOB = ["train.backend=numpy", "train.seed=3", "train.steps=4", "train.num_envs=8",
             "train.rollout_len=8", "replay.min_size=32", "lobsim.horizon=20"]  # fmt: skip


def test_a_linear_lr_schedule_sets_each_steps_rate() -> None:
    """With train.lr_schedule = 'linear' the k-th of `steps` Steps (k from 0) runs at
    lr x (1 - k / steps), and the rate reaches the update: the first Step matches a
    constant-rate job's to the byte, the second does not."""
    runs = {}
    for anneal in (False, True):
        schedule = "linear" if anneal else "constant"
        overrides = [*SMALL_JOB, "optim.lr=3e-3", f"train.lr_schedule={schedule}"]
        config = lobsim_model(load_config(env={}, overrides=overrides))
        trainer = Trainer(config)
        step = make_stepper(trainer, 8, 8, config.lobsim, 3)
        runs[anneal] = []
        for _ in range(config.train.steps):
            schedule_next_step(trainer, config.optim.lr)  # as the job's loop does
            step()
            runs[anneal].append((trainer.config.optim.lr, trainer.param_digest()))
    assert [lr for lr, _ in runs[True]] == pytest.approx([3e-3, 2.25e-3, 1.5e-3, 0.75e-3])
    assert [lr for lr, _ in runs[False]] == [3e-3] * 4
    assert runs[True][0][1] == runs[False][0][1]
    assert runs[True][1][1] != runs[False][1][1]


def test_the_learning_curve_is_drawn_whole(tmp_path: Path) -> None:
    """Every label of train.png lies inside the image: nothing is drawn on its outermost
    pixels, though the lower axes' tick labels (-0.025) are wider than the upper's (-60), which
    a layout fitted to the upper would leave past the left edge with the 'total loss' label."""
    from matplotlib.image import imread

    log, png = tmp_path / "train.csv", tmp_path / "train.png"
    steps = np.arange(1, 101)
    with log.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS)
        writer.writeheader()
        for step in steps:
            writer.writerow({column: "" for column in CSV_COLUMNS} | {
                "step": step, "env_steps": step * 8192,
                "reward_per_step": (-60 + 0.8 * step) / 400,
                "episode_return": -25 + 0.4 * step if step % 12 == 0 else "",
                "loss_total": -0.018 + 0.2 * (step == 1) + 0.16 * (step % 20 == 0)})  # fmt: skip
    levels = {"trained (greedy-π)": 15.2, "hold": 0.0, "random": -213.0, "quote(0,0)": -15.3,
              "inventory-skew": 16.8, "avellaneda-stoikov": 8.3}  # fmt: skip
    plot_learning_curve(log, png, horizon=400, rollout_len=32, levels=levels)
    pixels = imread(png)[..., :3]
    edges = (pixels[:2], pixels[-2:], pixels[:, :2], pixels[:, -2:])
    frame = np.concatenate([edge.reshape(-1, 3) for edge in edges])
    assert frame.min() > 0.95, "something is drawn on the image's edge: cut off"
