"""`trident train --env gymnasium:ID`: any Gymnasium env with Discrete actions, trained in-process.

The model's sizes come from the env's spaces (Box observations of any rank, flattened; no aux
targets) and its C51 support from a short probe (envs.fit_to_env). Act -> env step -> Step on
the configured backend, the envs on the host, into a run folder as the main job's
(run_folder.py): a CSV row per Step, a progress bar and a line every `train.log_every` Steps,
periodic checkpoints, the learning rate annealed as `train.lr_schedule` says, SIGINT / SIGTERM
saving a checkpoint and exiting 130. When training ends its checkpoint is committed; then the
greedy and the sampled policy head, the Q head's greedy choice and a uniformly random policy
each play the same EVAL_EPISODES episodes on fresh seeds (episode i of each policy starts from
seed + HELD_OUT + i): their mean returns and the paired differences against random, with 95 %
intervals, in eval.json / eval.txt, and the learning curve with those levels in train.png.
SIGINT / SIGTERM during the evaluation stops it, keeps the checkpoint and exits 130, printing
the `--resume` that evaluates it: a resume of a run whose training is done only evaluates, the
same as the run that never stopped. `--resume` restores the trainer; the envs start afresh (a
Gymnasium env's state is not part of a checkpoint).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from service.backend.blas import single_blas_thread
from service.checkpoint import restore_checkpoint, save_checkpoint
from service.config import Config
from service.envs import GymnasiumVectorEnv, fit_to_env, make_gymnasium_env
from service.jobs.device_loop import LoopStep
from service.jobs.evaluate import Interval, interval, paired_difference
from service.jobs.loop import CSV_COLUMNS, Checkpoints, TrainingLoop, header, rollout_step
from service.jobs.progress import Episodes, Phases
from service.jobs.run_folder import RunFolder, commit_trained
from service.jobs.scalars import ScalarLog
from service.jobs.train import HELD_OUT, smoothed, start_run
from service.signals import Stopped, raise_on_stop, stop_signals
from service.trainer.trainer import Trainer
from service.types import ActMode, CheckpointInfo

EVAL_EPISODES = 100  # per policy, the same seeds for each
EVAL_STEP_LIMIT = 100_000  # env steps an evaluation episode may take before it is cut
POLICIES = ("greedy-π", "sampled-π", "greedy-Q", "random")


def run_train_gym(
    config: Config,
    env: str,
    run_dir: Path,
    write_checkpoint: bool = True,
    resume: str | None = None,
    tensorboard: Path | None = None,
) -> int:
    """The job on `env` ("gymnasium:ID") into the run folder `run_dir`; `resume`: "latest" or a
    checkpoint name, checked before anything is written."""
    trainer, folder, name = start_run(fit_to_env(config, env), run_dir, resume)
    with single_blas_thread(trainer.backend.name):
        return _train_gym(trainer, env, folder, write_checkpoint, name, tensorboard)


def _train_gym(
    trainer: Trainer,
    env_name: str,
    folder: RunFolder,
    write_checkpoint: bool,
    resume: str | None,
    tensorboard: Path | None,
) -> int:
    config = trainer.config
    train = config.train
    env_id = env_name.removeprefix("gymnasium:")
    saved: CheckpointInfo | None = None
    if resume is not None:
        saved = restore_checkpoint(trainer, config.checkpoint.dir, resume)
        print(f"resumed from {saved.name} at step {trainer.global_step}; the envs start "
              "afresh (a Gymnasium env's state is not part of a checkpoint)",
              flush=True)  # fmt: skip
    env = make_gymnasium_env(env_id, train.num_envs, train.seed + trainer.global_step)
    sizes = f" obs_dim={config.model.obs_dim} actions={config.model.num_actions}"
    files = "config.toml, train.csv, train.png, eval.json, eval.txt"
    print(header(trainer, env_name, sizes, folder, files, True), flush=True)
    first = trainer.global_step

    def save(elapsed: float, replay: bool) -> CheckpointInfo:
        return save_checkpoint(trainer, config.checkpoint.dir, replay=replay)

    def status(done: LoopStep, rate: float, ended: Episodes) -> str:
        return f"{rate:.0f} env steps/s | {ended.text()}"

    def detail(done: LoopStep, ended: Episodes) -> str:
        since = "" if ended.count else " since the last line"
        return since + " | " + " ".join(f"{k} {v:.3f}" for k, v in done.result.losses.items())

    checkpoints = Checkpoints(trainer, save, saved)
    go_on = f"trident train --env {env_name} --resume --run-dir {folder.root}"
    with stop_signals() as stopping:
        try:
            with ScalarLog(folder.log_csv, CSV_COLUMNS, first if resume else None,
                           tensorboard) as log:  # fmt: skip
                loop = TrainingLoop(trainer, lambda: rollout_step(trainer, env, train.rollout_len),
                                    checkpoints, config.optim.lr, status, detail,
                                    f". Go on with: {go_on}", log)  # fmt: skip
                if loop.run(stopping):
                    return 130
        finally:
            env.close()
        final = commit_trained(checkpoints.now if write_checkpoint else None, checkpoints.saved,
                               trainer.global_step)  # fmt: skip
        print(f"{loop.trained(first)}; log {folder.log_csv}; evaluating on {EVAL_EPISODES} "
              "fresh episodes", flush=True)  # fmt: skip
        try:
            with raise_on_stop(stopping):
                report = evaluate_policies(trainer, env_id, train.seed + HELD_OUT,
                                           progress=sys.stdout)  # fmt: skip
                report.write(folder.root)
                print(report.text())
                plot_returns(folder.log_csv, folder.curve_png, env_name, report.returns)
        except Stopped as stop:
            folder.drop_evaluation()
            said = f"trident train: stopped by {stop.signal} during the evaluation"
            if final is None:
                print(f"{said}; no checkpoint (--no-checkpoint): the trained policy is not "
                      "kept", flush=True)  # fmt: skip
            else:
                print(f"{said}; training is done, checkpoint {final.name} kept. Evaluate it "
                      f"with: {go_on}", flush=True)  # fmt: skip
            return 130
    print(f"learning curve -> {folder.curve_png}; evaluation -> {folder.root / 'eval.json'}",
          flush=True)  # fmt: skip
    print(folder.size_line(config), flush=True)
    return 0


@dataclass(frozen=True)
class GymReport:
    """Each policy's episode returns (the same seeds, in order) and what they say."""

    env: str
    seed: int
    episodes: dict[str, list[float]]

    @property
    def returns(self) -> dict[str, Interval]:
        return {name: interval(np.array(values)) for name, values in self.episodes.items()}

    def against_random(self) -> dict[str, Interval]:
        random = np.array(self.episodes["random"])
        return {name: paired_difference(np.array(values), random)
                for name, values in self.episodes.items() if name != "random"}  # fmt: skip

    def text(self) -> str:
        lines = [f"evaluation of {self.env}: {EVAL_EPISODES} episodes per policy, the same "
                 f"seeds ({self.seed} + episode), mean ± 95 % interval",
                 f"{'policy':<12} return"]  # fmt: skip
        lines += [f"{name:<12} {value}" for name, value in self.returns.items()]
        lines.append("paired difference against random (same seeds):")
        for name, difference in self.against_random().items():
            low, high = difference.mean - difference.half, difference.mean + difference.half
            verdict = "better" if low > 0 else "worse" if high < 0 else "not apart"
            lines.append(f"{name:<12} {difference}  {verdict}")
        return "\n".join(lines)

    def write(self, folder: Path) -> None:
        body = {
            "env": self.env,
            "seed": self.seed,
            "episodes_per_policy": EVAL_EPISODES,
            "interval": "mean ± 1.96 standard errors over episodes (one per seed)",
            "returns": {name: value.to_json() for name, value in self.returns.items()},
            "against_random": {k: v.to_json() for k, v in self.against_random().items()},
            "episode_returns": self.episodes,
        }
        (folder / "eval.json").write_text(json.dumps(body, indent=1) + "\n")
        (folder / "eval.txt").write_text(self.text() + "\n")


def evaluate_policies(
    trainer: Trainer, env_id: str, seed: int, progress: TextIO | None = None
) -> GymReport:
    """Each policy plays episode i from seed `seed` + i, for i < EVAL_EPISODES; with a
    `progress` stream, the episodes show there as they end (a bar on a terminal; a line as
    each policy finishes)."""
    rng = np.random.default_rng(seed)
    num_actions = trainer.config.model.num_actions
    choose: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "greedy-π": lambda obs: trainer.act(obs, ActMode.GREEDY_PI).actions,
        "sampled-π": lambda obs: trainer.act(obs, ActMode.SAMPLE).actions,
        "greedy-Q": lambda obs: trainer.act(obs, ActMode.GREEDY_Q).actions,
        "random": lambda obs: rng.integers(0, num_actions, obs.shape[0]),
    }
    episodes = {}
    phases = None
    if progress is not None:
        phases = Phases("evaluation", EVAL_EPISODES * len(POLICIES), len(POLICIES),
                        stream=progress)  # fmt: skip
    try:
        for at, name in enumerate(POLICIES, 1):
            env = make_gymnasium_env(env_id, EVAL_EPISODES, seed)
            try:
                episodes[name] = first_episodes(env, choose[name], phases)
            finally:
                env.close()
            if phases is not None:
                phases.end(f"{name} played {EVAL_EPISODES} episodes", EVAL_EPISODES * at)
    finally:
        if phases is not None:
            phases.close()
    return GymReport(f"gymnasium:{env_id}", seed, episodes)


def first_episodes(
    env: GymnasiumVectorEnv,
    act: Callable[[np.ndarray], np.ndarray],
    phases: Phases | None = None,
) -> list[float]:
    """The return of each env's first episode (env i's, in order), under `act`; an episode
    still running after EVAL_STEP_LIMIT steps counts what it gathered. `phases` moves as
    episodes end."""
    N = env.num_envs
    returns, finished = np.zeros(N), np.zeros(N, bool)
    for _ in range(EVAL_STEP_LIMIT):
        moved = env.step(np.asarray(act(env.obs), np.int64))
        returns += np.where(finished, 0.0, moved.rewards)
        was = int(finished.sum())
        finished |= moved.terminated | moved.truncated
        if phases is not None:
            phases.advance(int(finished.sum()) - was)
        if finished.all():
            break
    return returns.tolist()


def plot_returns(log_csv: Path, png: Path, env: str, levels: dict[str, Interval]) -> None:
    """Episode returns of training (each Step's mean, and over the last 10 Steps) against env
    steps, with each evaluated policy's mean return as a line."""
    import csv

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with log_csv.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["episode_return"]]
    figure = Figure(figsize=(10, 5))
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    if rows:
        steps = np.array([float(r["env_steps"]) for r in rows])
        values = np.array([float(r["episode_return"]) for r in rows])
        axes.plot(steps, values, color="0.7", linewidth=0.8, label="episodes ended per Step")
        axes.plot(steps, smoothed(values, 10), color="black", linewidth=2,
                  label="mean of the last 10")  # fmt: skip
    styles = ("--", "-.", (0, (5, 1, 1, 1)), ":")  # one per policy of POLICIES
    for (name, level), style in zip(levels.items(), styles, strict=True):
        axes.axhline(level.mean, linestyle=style, color="tab:blue",
                     label=f"{name} (held out): {level}")  # fmt: skip
    axes.set_xlabel("env steps")
    axes.set_ylabel("episode return")
    axes.set_title(f"trident train --env {env}")
    axes.legend(fontsize="small")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    # bbox_inches="tight": the saved area takes in every artist, the legend outside the axes
    # and each axes' y label whatever the width of its tick labels
    figure.savefig(png, dpi=100, bbox_inches="tight", pad_inches=0.1)
