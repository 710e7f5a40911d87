"""`trident train --env lobsim`: train a market maker in-process, log it, compare it.

Act -> LobSim step -> Step on the configured backend. Every Step appends a row to a CSV log;
on a terminal a progress bar redraws after each Step, otherwise a line is printed every
`train.log_every` Steps. At the end: a learning-curve PNG from the CSV, one episode of held-out
markets for the trained greedy policy and the baselines, and a checkpoint. `--resume` restores
the newest checkpoint (or a named one) first and runs the remaining Steps up to `train.steps`;
the markets themselves start afresh (their state is not part of a checkpoint).
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.backend.blas import single_blas_thread
from service.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from service.config import Config, LobsimConfig, with_overrides
from service.envs import LobSimVectorEnv
from service.errors import InvalidInput
from service.jobs import evaluate
from service.jobs.device_loop import DeviceLoop, LoopStep
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, LobSim, observation_dim
from service.trainer.sizing import sized_backend
from service.trainer.trainer import Trainer
from service.types import ActMode
from service.vector_env import collect_rollout

HELD_OUT = 1_000_003  # evaluation seed = train.seed + this: markets training never saw
CSV_COLUMNS = ("step", "elapsed_s", "env_steps", "reward_per_step", "episodes", "episode_return",
               "loss_total", "loss_q", "loss_pi", "loss_v", "loss_bce", "loss_aux", "grad_norm",
               "entropy", "lr", "skipped")  # fmt: skip


def lobsim_model(config: Config) -> Config:
    """`config` with the model's input and output sizes set to LobSim's."""
    return with_overrides(
        config,
        [
            f"model.obs_dim={observation_dim(config.lobsim)}",
            f"model.num_actions={NUM_ACTIONS}",
            f"model.aux_dim={LABEL_DIM}",
        ],
    )


def run_train_lobsim(
    config: Config,
    write_checkpoint: bool,
    resume: str | None = None,
    log_csv: Path = Path("trident_train.csv"),
    curve_png: Path = Path("trident_train.png"),
    eval_dir: Path = Path("trident_eval"),
) -> int:
    """The main job; `resume`: "latest" or a checkpoint name under checkpoint.dir."""
    config, backend = sized_backend(lobsim_model(config))
    paths = (log_csv, curve_png, eval_dir)
    with single_blas_thread(backend.name):
        return _train_lobsim(Trainer(config, backend), write_checkpoint, resume, *paths)


def _train_lobsim(
    trainer: Trainer,
    write_checkpoint: bool,
    resume: str | None,
    log_csv: Path,
    curve_png: Path,
    eval_dir: Path,
) -> int:
    config = trainer.config
    if resume is not None:
        name = resume
        if resume == "latest":
            newest = latest_checkpoint(config.checkpoint.dir)
            if newest is None:
                raise InvalidInput("--resume", f"a checkpoint in {config.checkpoint.dir}", "none")
            name = newest.name
        info = restore_checkpoint(trainer, config.checkpoint.dir, name)
        print(f"resumed from {info.name} at step {trainer.global_step}", flush=True)
    train_cfg, lob = config.train, config.lobsim
    seed = train_cfg.seed + trainer.global_step
    next_step = job_stepper(trainer, config, seed)
    samples_per_step = train_cfg.num_envs * train_cfg.rollout_len
    remaining = max(0, train_cfg.steps - trainer.global_step)
    print(
        f"trident train: backend={trainer.backend.name} env=lobsim steps={train_cfg.steps} "
        f"rollout={train_cfg.rollout_len}x{train_cfg.num_envs} horizon={lob.horizon} "
        f"seed={train_cfg.seed}",
        flush=True,
    )
    started = time.perf_counter()
    first = trainer.global_step
    interactive = sys.stdout.isatty()
    every = config.checkpoint.every_steps
    returns = [0, 0.0]  # episodes ended since the last printed line, and their return sum
    log_csv.parent.mkdir(parents=True, exist_ok=True)
    with log_csv.open("a" if resume else "w", newline="") as handle:
        writer = csv.writer(handle)
        if not resume or handle.tell() == 0:
            writer.writerow(CSV_COLUMNS)

        def on_step(step: int, progress: LoopStep) -> None:
            result = progress.result
            if every and step % every == 0:
                save_checkpoint(trainer, config.checkpoint.dir)
            returns[0] += progress.episodes
            returns[1] += progress.return_sum
            elapsed = time.perf_counter() - started
            rate = (step - first) * samples_per_step / max(elapsed, 1e-9)
            losses = result.losses
            for warning in result.warnings:
                print(("\n" if interactive else "") + f"warning: {warning}", flush=True)
            mean_return = progress.return_sum / max(progress.episodes, 1)
            writer.writerow(
                [step, f"{elapsed:.3f}", step * samples_per_step, f"{progress.mean_reward:.6f}",
                 progress.episodes, f"{mean_return:.4f}" if progress.episodes else "",
                 *(f"{losses[k]:.6f}" if k in losses else ""
                   for k in ("total", "q", "pi", "v", "bce", "aux")),
                 f"{result.grad_norm:.6f}", f"{result.entropy:.6f}",
                 f"{trainer.config.optim.lr:.6g}", int(result.skipped)]
            )  # fmt: skip
            episode = (
                f"{returns[1] / returns[0]:8.2f} ({returns[0]})" if returns[0] else "     n/a"
            )
            line = (
                f"{step:>5}/{train_cfg.steps} | {rate:7.0f} env steps/s | reward/step "
                f"{progress.mean_reward:7.3f} | episode return {episode} | loss "
                f"{losses.get('total', float('nan')):.3f}"
            )
            if interactive:
                done = int(30 * step / max(train_cfg.steps, 1))
                print(f"\r[{'#' * done}{'.' * (30 - done)}] {line}", end="", flush=True)
            if step % train_cfg.log_every == 0 or step == train_cfg.steps:
                detail = " ".join(f"{k} {v:.3f}" for k, v in losses.items())
                print(("\n" if interactive else "") + f"step {line} | {detail}", flush=True)
                returns[:] = [0, 0.0]

        for _ in range(remaining):
            progress = next_step()  # before reading global_step: the Step advances it
            on_step(trainer.global_step, progress)
    elapsed = time.perf_counter() - started
    plot_learning_curve(log_csv, curve_png)
    print(
        f"trained {trainer.global_step - first} steps in {elapsed:.1f} s; log {log_csv}, "
        f"learning curve {curve_png}; evaluating on held-out seeds",
        flush=True,
    )
    compare_with_baselines(trainer, config, eval_dir)
    if write_checkpoint:
        info = save_checkpoint(trainer, config.checkpoint.dir)
        print(f"checkpoint {info.name} -> {info.path} ({info.size_bytes} bytes)", flush=True)
    return 0


def job_stepper(trainer: Trainer, config: Config, seed: int) -> Callable[[], LoopStep]:
    """The main job's Step: `make_stepper` with `config.train`'s sizes, and with a 'linear'
    train.lr_schedule the learning rate set before each Step from `config.optim.lr` (the job's,
    not the trainer's, so a resumed job continues the same schedule)."""
    train = config.train
    step = make_stepper(trainer, train.num_envs, train.rollout_len, config.lobsim, seed)
    if train.lr_schedule == "constant":
        return step
    lr, steps = config.optim.lr, train.steps

    def annealed() -> LoopStep:
        trainer.update_hyperparams({"optim.lr": lr * (1 - trainer.global_step / steps)})
        return step()

    return annealed


def make_stepper(
    trainer: Trainer, num_envs: int, horizon: int, cfg: LobsimConfig, seed: int
) -> Callable[[], LoopStep]:
    """One Step of training on `num_envs` fresh markets: on NumPy the host loop (the one
    remote actors run), on the GPU the device loop, where the markets live on the device too."""
    if trainer.xp is not np:
        return DeviceLoop(trainer, LobSim(num_envs, cfg, seed, backend="cuda"), horizon).step
    env = LobSimVectorEnv(num_envs, cfg, seed)

    def on_host() -> LoopStep:
        rollout = collect_rollout(lambda obs: trainer.act(obs, ActMode.SAMPLE), env, horizon)
        result = trainer.step(rollout)
        ended = env.take_returns()
        return LoopStep(result, float(rollout.rewards.mean()), len(ended), float(sum(ended)))

    return on_host


def compare_with_baselines(
    trainer: Trainer, config: Config, out_dir: Path = Path("trident_eval")
) -> evaluate.Report:
    """The trained greedy policy against the baselines (Avellaneda–Stoikov tuned on the
    training seed) on evaluate.EVAL_MARKETS held-out markets: the table, the verdict, and
    evaluate.JSON_NAME and evaluate.PNG_NAME in `out_dir`."""
    seed, train_seed = config.train.seed + HELD_OUT, config.train.seed
    print(
        f"evaluation: {evaluate.EVAL_MARKETS} held-out markets, seed {seed}; "
        f"Avellaneda-Stoikov tuned on training seed {train_seed}",
        flush=True,
    )
    act = lambda obs, mask: trainer.act(obs, ActMode.GREEDY_PI).actions  # noqa: E731
    report = evaluate.compare(
        lambda env: act, config.lobsim, seed, train_seed, out_dir=out_dir, title="trident train"
    )
    print(report.text())
    print(
        f"evaluation -> {out_dir / evaluate.JSON_NAME}, {out_dir / evaluate.PNG_NAME}", flush=True
    )
    return report


def plot_learning_curve(log_csv: Path, png: Path) -> None:
    """Episode return and total loss against env steps, from the CSV log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with log_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    steps = np.array([float(r["env_steps"]) for r in rows])
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ended = [(s, float(r["episode_return"])) for s, r in zip(steps, rows, strict=True)
             if r["episode_return"]]  # fmt: skip
    if ended:
        top.plot(*zip(*ended, strict=True), marker="o")
    top.set_ylabel("mean episode return (ticks)")
    loss = [(s, float(r["loss_total"])) for s, r in zip(steps, rows, strict=True)
            if r["loss_total"]]  # fmt: skip
    if loss:
        bottom.plot(*zip(*loss, strict=True))
    bottom.set_ylabel("total loss")
    bottom.set_xlabel("env steps")
    top.set_title("trident train --env lobsim")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=100)
    plt.close(figure)
