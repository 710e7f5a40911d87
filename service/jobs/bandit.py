"""`trident train --env bandit`: the trainer on the synthetic contextual bandit, in-process."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from service.backend.blas import single_blas_thread
from service.checkpoint import save_checkpoint
from service.config import Config
from service.jobs.device_loop import LoopStep
from service.jobs.loop import Checkpoints, TrainingLoop, header, rollout_step
from service.jobs.progress import Episodes
from service.jobs.run_folder import RunFolder, commit_trained
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
    saves = write_checkpoint or bool(config.checkpoint.every_steps)
    print(header(trainer, "bandit", "", folder, "config.toml", saves), flush=True)

    def next_step() -> LoopStep:
        """Each env step is a one-step episode: the rollout's every reward is an episode's."""
        done = rollout_step(trainer, env, train_cfg.rollout_len)
        return replace(done, episodes=samples_per_step,
                       return_sum=done.mean_reward * samples_per_step)  # fmt: skip

    def status(done: LoopStep, rate: float, ended: Episodes) -> str:
        return f"{rate:.0f} samples/s | reward {done.mean_reward:.3f}"

    def detail(done: LoopStep, ended: Episodes) -> str:
        result = done.result
        losses = " ".join(f"{k} {v:.3f}" for k, v in result.losses.items())
        skipped = f" | skipped: {result.skip_reason}" if result.skipped else ""
        pi, q = (greedy_accuracy(trainer, env, mode) for mode in (ActMode.GREEDY_PI,
                                                                   ActMode.GREEDY_Q))  # fmt: skip
        return (f" | reward {ended.total / ended.count:.3f} over the {ended.count} one-step "
                f"episodes since the last line | {losses} | greedy-π {pi:.1%} "
                f"greedy-Q {q:.1%}{skipped}")  # fmt: skip

    save = lambda elapsed, replay: save_checkpoint(trainer, config.checkpoint.dir)  # noqa: E731
    checkpoints = Checkpoints(trainer, save)
    resume = " (the bandit job starts afresh: --resume is for --env lobsim)"
    loop = TrainingLoop(trainer, next_step, checkpoints, config.optim.lr, status, detail, resume)
    with stop_signals() as stopping:
        if loop.run(stopping):
            return 130
        # the trained state, before the greedy Acts of the last line
        commit_trained(checkpoints.now if write_checkpoint else None, None, trainer.global_step)
    print(
        f"done: {trainer.global_step} steps, {trainer.global_step * samples_per_step} samples "
        f"in {loop.ran_s:.1f} s | greedy-π {greedy_accuracy(trainer, env, ActMode.GREEDY_PI):.1%} "
        f"greedy-Q {greedy_accuracy(trainer, env, ActMode.GREEDY_Q):.1%} | "
        f"param_digest {trainer.param_digest()[:16]}",
        flush=True,
    )
    return 0
