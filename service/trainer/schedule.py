"""The learning rate over a run: `train.lr_schedule` over `train.steps` Steps.

'linear' is CleanRL's anneal_lr: the base rate (optim.lr) times 1 - done / steps before each
Step, where done is the Steps applied so far: the run's last Step runs at optim.lr / steps.
The in-process jobs and a server apply it alike: a server's run is its train.steps Steps,
whatever number of actors send them (`trident actor` stops there by default). Steps past the
end keep that last rate (not 0: optim.lr = 0 stands for the backend's rate, which a checkpoint
would restore) and `ended` says so.

A server left at train.steps = 0 is a service with no end: no horizon to anneal towards, so
it trains at optim.lr from its first Step to its last (the constant rate beat the skew rule on
every seed of the CUDA sweep, docs/benchmarks/learning.md; a linear schedule needs the run's
length).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.config import TrainConfig

if TYPE_CHECKING:
    from service.trainer.trainer import Trainer

COOLDOWN = 100  # Steps between two warnings that the schedule has ended


def learning_rate(train: TrainConfig, base: float, global_step: int) -> float:
    """The rate of the Step after `global_step` applied ones."""
    if train.lr_schedule == "constant" or not train.steps:
        return base
    done = min(global_step, train.steps - 1)  # past the end: the last Step's rate
    return base * (1 - done / train.steps)


def schedule_next_step(trainer: Trainer, base: float) -> None:
    """Set the trainer's rate for its next Step from `base`, where it changes (a write of the
    settings the update reads, and on a device a wait for it)."""
    lr = learning_rate(trainer.config.train, base, trainer.global_step)
    if lr != trainer.config.optim.lr:
        trainer.update_hyperparams({"optim.lr": lr})


def ended(train: TrainConfig, global_step: int) -> str | None:
    """A warning for a Step applied after the schedule ended (`global_step` counts it), on the
    first such Step and every COOLDOWN after; else None."""
    past = global_step - train.steps - 1
    if train.lr_schedule == "constant" or not train.steps or past < 0 or past % COOLDOWN:
        return None
    return (
        f"lr_schedule: the linear schedule ended at train.steps = {train.steps} Steps; Steps go "
        f"on at its last rate, optim.lr / {train.steps}. Restart the server with a larger "
        "train.steps (--resume keeps the state), or train.lr_schedule=constant"
    )


def where(train: TrainConfig, global_step: int) -> str:
    """Where the schedule stands after `global_step` Steps, in words (`trident status`)."""
    if not train.steps:
        return "constant: no train.steps, a run with no end"
    if train.lr_schedule == "constant":
        return f"constant over train.steps = {train.steps}"
    if global_step >= train.steps:
        return f"linear over {train.steps} Steps: ended, at its last rate"
    return f"linear over {train.steps} Steps: {global_step} done, {train.steps - global_step} to go"
