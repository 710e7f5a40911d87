"""`trident train --env bandit`: the trainer on the synthetic contextual bandit, in-process."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from service.backend.blas import single_blas_thread
from service.checkpoint import CheckpointInfo, save_checkpoint
from service.config import Config
from service.jobs.loop import LoopProgress, train
from service.jobs.progress import Episodes, Progress
from service.jobs.run_folder import RunFolder
from service.signals import stop_signals
from service.synthetic import ContextualBandit
from service.trainer.sizing import sized_backend
from service.trainer.trainer import Trainer
from service.types import ActMode

EVAL_CONTEXTS = 2048  # held-out contexts of the greedy accuracy


def greedy_accuracy(trainer: Trainer, env: ContextualBandit, mode: ActMode) -> float:
    """Share of held-out contexts on which the greedy action is the rewarded one."""
    obs, correct = env.evaluation_set(EVAL_CONTEXTS, seed=trainer.config.train.seed)
    return float(np.mean(trainer.act(obs, mode).actions == correct))


def run_train_bandit(config: Config, run_dir: Path, write_checkpoint: bool = True) -> int:
    """`trident train --env bandit`: the contextual bandit, greedy accuracy per log line, its
    config and checkpoints in the run folder `run_dir`."""
    config, backend = sized_backend(config, job=True)
    folder = RunFolder(run_dir)
    config = folder.prepare(config)
    with single_blas_thread(backend.name):
        return _train_bandit(Trainer(config, backend), folder, write_checkpoint)


def _train_bandit(trainer: Trainer, folder: RunFolder, write_checkpoint: bool) -> int:
    config = trainer.config
    train_cfg = config.train
    env = ContextualBandit(
        train_cfg.num_envs, config.model.obs_dim, config.model.num_actions, train_cfg.seed
    )
    samples_per_step = train_cfg.num_envs * train_cfg.rollout_len
    every = config.checkpoint.every_steps
    print(
        f"trident train: backend={trainer.backend.name} env=bandit steps={train_cfg.steps} "
        f"rollout={train_cfg.rollout_len}x{train_cfg.num_envs} seed={train_cfg.seed}\n"
        f"run folder {folder.root}: config.toml"
        + (f"; checkpoints in {config.checkpoint.dir}" if write_checkpoint or every else ""),
        flush=True,
    )
    started = time.perf_counter()
    saved: list[CheckpointInfo] = []  # the last checkpoint saved
    ended = Episodes()  # since the last log line; each env step is a one-step episode

    def checkpoint_now() -> CheckpointInfo:
        """A checkpoint of the state as it is: the last one saved, when it holds this Step."""
        if not saved or saved[-1].global_step != trainer.global_step:
            saved.append(save_checkpoint(trainer, config.checkpoint.dir))
        return saved[-1]

    def report(done: LoopProgress) -> None:
        step, result = done.step, done.result
        if every and step % every == 0:
            checkpoint_now()
        elapsed = time.perf_counter() - started
        ended.add(samples_per_step, done.mean_reward * samples_per_step)
        rate = f"{step * samples_per_step / elapsed:.0f} samples/s"
        bar.step(f"{rate} | reward {done.mean_reward:.3f}")
        if step % train_cfg.log_every and step != train_cfg.steps:
            return
        losses = " ".join(f"{k} {v:.3f}" for k, v in result.losses.items())
        skipped = f" | skipped: {result.skip_reason}" if result.skipped else ""
        episodes, total = ended.take()
        bar.log(
            f"step {step}/{train_cfg.steps} | {rate} | reward {total / episodes:.3f} over the "
            f"{episodes} one-step episodes since the last line | {losses}"
            f" | greedy-π {greedy_accuracy(trainer, env, ActMode.GREEDY_PI):.1%}"
            f" greedy-Q {greedy_accuracy(trainer, env, ActMode.GREEDY_Q):.1%}{skipped}"
        )

    with Progress(train_cfg.steps) as bar, stop_signals() as stopping:
        train(trainer, env, train_cfg.steps, train_cfg.rollout_len, report, lambda: bool(stopping))
        if stopping:
            info = checkpoint_now()
            print(f"trident train: stopped by {stopping[0]} at step {trainer.global_step}/"
                  f"{train_cfg.steps}; checkpoint {info.name} (the bandit job starts afresh: "
                  "--resume is for --env lobsim)", flush=True)  # fmt: skip
            return 130
        elapsed = time.perf_counter() - started
        if write_checkpoint:  # the trained state, before the greedy Acts of the last line
            info = checkpoint_now()
            print(f"checkpoint {info.name} -> {info.path} ({info.size_bytes} bytes)", flush=True)
    print(
        f"done: {trainer.global_step} steps, {trainer.global_step * samples_per_step} samples "
        f"in {elapsed:.1f} s | greedy-π {greedy_accuracy(trainer, env, ActMode.GREEDY_PI):.1%} "
        f"greedy-Q {greedy_accuracy(trainer, env, ActMode.GREEDY_Q):.1%} | "
        f"param_digest {trainer.param_digest()[:16]}",
        flush=True,
    )
    return 0
