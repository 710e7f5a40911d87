"""`trident` command line. `trident train` runs the main job in-process."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from service.checkpoint import save_checkpoint
from service.config import Config, ConfigError, load_config
from service.errors import TridentError
from service.synthetic import ContextualBandit
from service.trainer.loop import Progress, train
from service.trainer.trainer import ActMode, Trainer

EVAL_CONTEXTS = 2048


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting (repeatable); beats the file and TRIDENT_* variables",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trident", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train_cmd = commands.add_parser("train", help="train in-process on a synthetic task")
    _add_config_flags(train_cmd)
    train_cmd.add_argument(
        "--env", choices=("bandit",), default="bandit", help="environment (bandit: contextual)"
    )
    train_cmd.add_argument("--no-checkpoint", action="store_true", help="skip the final checkpoint")
    return parser


def greedy_accuracy(trainer: Trainer, env: ContextualBandit, mode: ActMode) -> float:
    """Share of held-out contexts on which the greedy action is the rewarded one."""
    obs, correct = env.evaluation_set(EVAL_CONTEXTS, seed=trainer.config.train.seed)
    return float(np.mean(trainer.act(obs, mode).actions == correct))


def run_train(config: Config, write_checkpoint: bool) -> int:
    trainer = Trainer(config)
    train_cfg = config.train
    env = ContextualBandit(
        train_cfg.num_envs, config.model.obs_dim, config.model.num_actions, train_cfg.seed
    )
    samples_per_step = train_cfg.num_envs * train_cfg.rollout_len
    print(
        f"trident train: backend={trainer.backend.name} env=bandit steps={train_cfg.steps} "
        f"rollout={train_cfg.rollout_len}x{train_cfg.num_envs} seed={train_cfg.seed}",
        flush=True,
    )
    started = time.perf_counter()
    every = config.checkpoint.every_steps

    def report(progress: Progress) -> None:
        step, result = progress.step, progress.result
        if every and step % every == 0:
            save_checkpoint(trainer, config.checkpoint.dir)
        if step % train_cfg.log_every and step != train_cfg.steps:
            return
        elapsed = time.perf_counter() - started
        losses = " ".join(f"{k} {v:.3f}" for k, v in result.losses.items())
        skipped = f" | skipped: {result.skip_reason}" if result.skipped else ""
        print(
            f"step {step:>5}/{train_cfg.steps} | {step * samples_per_step / elapsed:8.0f} "
            f"samples/s | reward {progress.mean_reward:.3f} | {losses}"
            f" | greedy-π {greedy_accuracy(trainer, env, ActMode.GREEDY_PI):.1%}"
            f" greedy-Q {greedy_accuracy(trainer, env, ActMode.GREEDY_Q):.1%}{skipped}",
            flush=True,
        )

    train(trainer, env, train_cfg.steps, train_cfg.rollout_len, report)
    elapsed = time.perf_counter() - started
    print(
        f"done: {trainer.global_step} steps, {trainer.global_step * samples_per_step} samples "
        f"in {elapsed:.1f} s | greedy-π {greedy_accuracy(trainer, env, ActMode.GREEDY_PI):.1%} "
        f"greedy-Q {greedy_accuracy(trainer, env, ActMode.GREEDY_Q):.1%} | "
        f"param_digest {trainer.param_digest()[:16]}",
        flush=True,
    )
    if write_checkpoint:
        info = save_checkpoint(trainer, config.checkpoint.dir)
        print(f"checkpoint {info.name} -> {info.path} ({info.size_bytes} bytes)", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, overrides=args.overrides)
        if args.command == "train":
            return run_train(config, write_checkpoint=not args.no_checkpoint)
    except (ConfigError, TridentError) as error:
        print(f"trident: error: {error}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
