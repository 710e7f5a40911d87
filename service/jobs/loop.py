"""The in-process training loop every `trident train` job runs (Acme's EnvironmentLoop).

A job supplies what is its own: one Step of its environment (`next_step`: a rollout and the
Step on it), how it saves a checkpoint, and the words of its progress line and log line. The
loop does the rest in one place: the header line, the learning rate set before each Step as
`train.lr_schedule` says, a CSV row per Step (and TensorBoard events), the progress bar and a
line every `train.log_every` Steps counting every episode since the line before, periodic
checkpoints every `checkpoint.every_steps`, warnings shown once, and SIGINT / SIGTERM ending the
Step in progress with a checkpoint there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service import logs
from service.jobs.device_loop import LoopStep
from service.jobs.progress import Episodes, Progress
from service.jobs.run_folder import RunFolder
from service.jobs.scalars import ScalarLog, Value
from service.trainer.schedule import schedule_next_step
from service.trainer.trainer import Trainer
from service.types import ActMode, CheckpointInfo
from service.vector_env import VectorEnv, collect_rollout

CSV_COLUMNS = ("step", "elapsed_s", "env_steps", "reward_per_step", "episodes", "episode_return",
               "loss_total", "loss_q", "loss_pi", "loss_v", "loss_bce", "loss_aux", "grad_norm",
               "entropy", "lr", "skipped")  # fmt: skip
LOSSES = ("total", "q", "pi", "v", "bce", "aux")  # the loss_* columns


def rollout_step(trainer: Trainer, env: VectorEnv, horizon: int) -> LoopStep:
    """A rollout of `horizon` steps on a host env under the trainer's sampled policy, and one
    Step on it; the episodes that ended are the env's `take_returns()` where it has one."""
    rollout = collect_rollout(lambda obs: trainer.act(obs, ActMode.SAMPLE), env, horizon)
    result = trainer.step(rollout)
    take = getattr(env, "take_returns", None)
    ended = take() if take is not None else []
    return LoopStep(result, float(rollout.rewards.mean()), len(ended), float(sum(ended)))


def train(trainer: Trainer, env: VectorEnv, steps: int, horizon: int) -> None:
    """`steps` Steps of `rollout_step`, at the trainer's settings: no log, no checkpoint."""
    for _ in range(steps):
        rollout_step(trainer, env, horizon)


def header(trainer: Trainer, env: str, sizes: str, folder: RunFolder, files: str,
           checkpoints: bool, tensorboard: Path | None = None) -> str:  # fmt: skip
    """A job's first two lines: what it trains, and what its run folder will hold."""
    config = trainer.config
    train = config.train
    return (
        f"trident train: backend={trainer.backend.name} env={env} steps={train.steps} "
        f"rollout={train.rollout_len}x{train.num_envs}{sizes} seed={train.seed}\n"
        f"run folder {folder.root}: {files}"
        + (f"; checkpoints in {config.checkpoint.dir}" if checkpoints else "")
        + (f"; TensorBoard events in {tensorboard}" if tensorboard else "")
    )


class Checkpoints:
    """A job's checkpoints. `save(elapsed, replay)` writes one (elapsed: the job's clock, for a
    job that keeps it); `now` gives the state as it is: the last one saved where it holds this
    Step. Once training is done the replay buffer is left out: a resume of a finished run only
    evaluates it; one stopped before needs the buffer to go on exactly."""

    def __init__(
        self,
        trainer: Trainer,
        save: Callable[[float, bool], CheckpointInfo],
        saved: CheckpointInfo | None = None,
    ) -> None:
        self.trainer, self._save, self.saved = trainer, save, saved

    def now(self, elapsed: float = 0.0) -> CheckpointInfo:
        trainer = self.trainer
        if self.saved is None or self.saved.global_step != trainer.global_step:
            done = trainer.global_step >= trainer.config.train.steps
            self.saved = self._save(elapsed, not done)
        return self.saved


@dataclass
class TrainingLoop:
    """The loop of one job: `run` trains up to `train.steps` and returns 0, or 130 where a
    signal stopped it (after a checkpoint at the Step where it stopped and a line saying so,
    `resume` appended: how to go on)."""

    trainer: Trainer
    next_step: Callable[[], LoopStep]  # one rollout and one Step on it
    checkpoints: Checkpoints
    base_lr: float  # the job's optim.lr, which the schedule anneals from
    # the progress bar's text from a Step, the env steps (samples) per second so far and the
    # episodes since the last log line
    status: Callable[[LoopStep, float, Episodes], str]
    # the log line's text after "step N/S | status" from the Step and the episodes since
    detail: Callable[[LoopStep, Episodes], str]
    resume: str  # appended to the stop line: how to go on
    scalars: ScalarLog | None = None
    elapsed_before: float = 0.0  # the job's clock at its start (a resumed job's goes on)
    ran_s: float = 0.0  # this process's time to its latest Step: its rates count its own only
    elapsed: float = 0.0  # the job's clock at its latest Step

    def run(self, stopping: list[str]) -> int:
        trainer = self.trainer
        train, every = trainer.config.train, trainer.config.checkpoint.every_steps
        samples = train.num_envs * train.rollout_len
        first = trainer.global_step
        started = time.perf_counter() - self.elapsed_before
        ended, warned = Episodes(), logs.FirstOfKind()
        with Progress(train.steps, first) as progress:
            for _ in range(max(0, train.steps - first)):
                if stopping:
                    break
                schedule_next_step(trainer, self.base_lr)
                done = self.next_step()  # before reading global_step: the Step advances it
                step, result = trainer.global_step, done.result
                self.elapsed = time.perf_counter() - started
                self.ran_s = self.elapsed - self.elapsed_before
                ended.add(done.episodes, done.return_sum)
                if self.scalars is not None:  # before the checkpoint: a resume cuts back after
                    self.scalars.write(self.row(step, done, samples))
                if every and step % every == 0:
                    self.checkpoints.now(self.elapsed)
                for warning in warned.new(result.warnings):
                    progress.log(f"warning (shown once): {warning}")
                status = self.status(done, (step - first) * samples / max(self.ran_s, 1e-9), ended)
                progress.step(status)
                if step % train.log_every == 0 or step == train.steps:
                    progress.log(f"step {step}/{train.steps} | {status}"
                                 f"{self.detail(done, ended)}")  # fmt: skip
                    ended.take()
        if not stopping:
            return 0
        name = self.checkpoints.now(time.perf_counter() - started).name
        print(f"trident train: stopped by {stopping[0]} at step {trainer.global_step}/"
              f"{train.steps}; checkpoint {name}{self.resume}", flush=True)  # fmt: skip
        return 130

    def row(self, step: int, done: LoopStep, samples: int) -> dict[str, Value]:
        """The CSV row of the Step that made `step`."""
        result, losses = done.result, done.result.losses
        return {
            "step": step, "elapsed_s": self.elapsed, "env_steps": step * samples,
            "reward_per_step": done.mean_reward, "episodes": done.episodes,
            "episode_return": done.return_sum / done.episodes if done.episodes else None,
            **{f"loss_{k}": losses.get(k) for k in LOSSES},
            "grad_norm": result.grad_norm, "entropy": result.entropy,
            "lr": self.trainer.config.optim.lr, "skipped": int(result.skipped),
        }  # fmt: skip

    def trained(self, first: int) -> str:
        """What the job says when training ends: the Steps this process ran and their time."""
        trainer, steps = self.trainer, self.trainer.config.train.steps
        done = trainer.global_step - first
        if done:
            return f"trained {done} steps in {self.ran_s:.1f} s"
        return f"training done at step {trainer.global_step}/{steps}"
