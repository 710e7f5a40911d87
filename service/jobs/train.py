"""`trident train --env lobsim`: train a market maker in-process, log it, compare it.

Act -> LobSim step -> Step on the configured backend, into a run folder (run_folder.py):
every Step appends a row to its CSV log (and to TensorBoard with `tensorboard`); on a terminal
a progress bar moves with each Step, and a line is printed every `train.log_every` Steps. At the
end: one episode of held-out markets for the trained greedy policy and the baselines, the
learning curve with the baselines' returns beside it, and a checkpoint. `--resume` restores the
newest checkpoint (or a named one) first and runs the remaining Steps up to `train.steps`; the
markets themselves start afresh (their state is not part of a checkpoint).
"""

from __future__ import annotations

import csv
import itertools
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from service.backend.blas import single_blas_thread
from service.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from service.config import Config, LobsimConfig, with_overrides
from service.envs import LobSimVectorEnv
from service.errors import InvalidInput
from service.jobs import evaluate
from service.jobs.device_loop import DeviceLoop, LoopStep
from service.jobs.progress import Progress
from service.jobs.run_folder import RunFolder
from service.jobs.scalars import ScalarLog, Value
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, LobSim, observation_dim
from service.trainer.sizing import sized_backend
from service.trainer.trainer import Trainer
from service.types import ActMode
from service.vector_env import collect_rollout

HELD_OUT = 1_000_003  # evaluation seed = train.seed + this: markets training never saw
CSV_COLUMNS = ("step", "elapsed_s", "env_steps", "reward_per_step", "episodes", "episode_return",
               "loss_total", "loss_q", "loss_pi", "loss_v", "loss_bce", "loss_aux", "grad_norm",
               "entropy", "lr", "skipped")  # fmt: skip
LOSSES = ("total", "q", "pi", "v", "bce", "aux")  # the loss_* columns


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
    run_dir: Path,
    write_checkpoint: bool = True,
    resume: str | None = None,
    tensorboard: Path | None = None,
) -> int:
    """The main job into the run folder `run_dir`; `resume`: "latest" or a checkpoint name
    under checkpoint.dir; `tensorboard`: a directory for TensorBoard events too."""
    config, backend = sized_backend(lobsim_model(config))
    folder = RunFolder(run_dir)
    config = folder.prepare(config)
    with single_blas_thread(backend.name):
        trainer = Trainer(config, backend)
        return _train_lobsim(trainer, folder, write_checkpoint, resume, tensorboard)


def _train_lobsim(
    trainer: Trainer,
    folder: RunFolder,
    write_checkpoint: bool,
    resume: str | None,
    tensorboard: Path | None,
) -> int:
    config = trainer.config
    if resume is not None:
        name = resume
        if resume == "latest":
            newest = latest_checkpoint(config.checkpoint.dir)
            if newest is None:
                raise InvalidInput(
                    "--resume", f"a checkpoint in {config.checkpoint.dir} (--run-dir: the run "
                    "to continue)", "none",
                )  # fmt: skip
            name = newest.name
        info = restore_checkpoint(trainer, config.checkpoint.dir, name)
        print(f"resumed from {info.name} at step {trainer.global_step}", flush=True)
    train_cfg, lob = config.train, config.lobsim
    seed = train_cfg.seed + trainer.global_step
    next_step = job_stepper(trainer, config, seed)
    samples_per_step = train_cfg.num_envs * train_cfg.rollout_len
    remaining = max(0, train_cfg.steps - trainer.global_step)
    saves = write_checkpoint or config.checkpoint.every_steps
    print(
        f"trident train: backend={trainer.backend.name} env=lobsim steps={train_cfg.steps} "
        f"rollout={train_cfg.rollout_len}x{train_cfg.num_envs} horizon={lob.horizon} "
        f"seed={train_cfg.seed}\n"
        f"run folder {folder.root}: config.toml, train.csv, train.png, eval.json, eval.txt, "
        "eval.png"
        + (f"; checkpoints in {config.checkpoint.dir}" if saves else "")
        + (f"; TensorBoard events in {tensorboard}" if tensorboard else ""),
        flush=True,
    )
    started = time.perf_counter()
    first = trainer.global_step
    every = config.checkpoint.every_steps
    episode_steps = lob.horizon / train_cfg.rollout_len
    ended = [0, 0.0]  # episodes ended since the last log line, and their return sum
    with (
        ScalarLog(folder.log_csv, CSV_COLUMNS, resume is not None, tensorboard) as scalars,
        Progress(train_cfg.steps, first) as progress,
    ):
        for _ in range(remaining):
            loop = next_step()  # before reading global_step: the Step advances it
            step, result, losses = trainer.global_step, loop.result, loop.result.losses
            if every and step % every == 0:
                save_checkpoint(trainer, config.checkpoint.dir)
            elapsed = time.perf_counter() - started
            ended[0] += loop.episodes
            ended[1] += loop.return_sum
            row: dict[str, Value] = {
                "step": step, "elapsed_s": elapsed, "env_steps": step * samples_per_step,
                "reward_per_step": loop.mean_reward, "episodes": loop.episodes,
                "episode_return": loop.return_sum / loop.episodes if loop.episodes else None,
                **{f"loss_{k}": losses.get(k) for k in LOSSES},
                "grad_norm": result.grad_norm, "entropy": result.entropy,
                "lr": trainer.config.optim.lr, "skipped": int(result.skipped),
            }  # fmt: skip
            scalars.write(row)
            for warning in result.warnings:
                progress.log(f"warning: {warning}")
            rate = (step - first) * samples_per_step / max(elapsed, 1e-9)
            status = (f"{rate:.0f} env steps/s | reward/step {loop.mean_reward:.3f} | loss "
                      f"{losses.get('total', float('nan')):.3f}")  # fmt: skip
            progress.step(status)
            if step % train_cfg.log_every == 0 or step == train_cfg.steps:
                episode = (
                    f"episode return {ended[1] / ended[0]:.2f} ({ended[0]} ended)"
                    if ended[0]
                    else f"no episode ended since the last line (one is {lob.horizon} env "
                    f"steps, {episode_steps:g} Steps)"
                )
                detail = " ".join(f"{k} {v:.3f}" for k, v in losses.items() if k != "total")
                progress.log(f"step {step}/{train_cfg.steps} | {status} | {episode} | {detail}")
                ended[:] = [0, 0.0]
    elapsed = time.perf_counter() - started
    print(
        f"trained {trainer.global_step - first} steps in {elapsed:.1f} s; log {folder.log_csv}; "
        "evaluating on held-out markets",
        flush=True,
    )
    report = compare_with_baselines(trainer, config, folder.root)
    levels = {name: row["return"].mean for name, row in report.metrics.items()}
    plot_learning_curve(folder.log_csv, folder.curve_png, lob.horizon, train_cfg.rollout_len,
                        levels)  # fmt: skip
    print(f"learning curve -> {folder.curve_png}", flush=True)
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


def compare_with_baselines(trainer: Trainer, config: Config, out_dir: Path) -> evaluate.Report:
    """The trained greedy policy against the baselines (Avellaneda–Stoikov tuned on the
    training seed) on evaluate.EVAL_MARKETS held-out markets: the table and the verdict, and
    evaluate's JSON, text and PNG files in `out_dir`."""
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
    names = (evaluate.JSON_NAME, evaluate.TEXT_NAME, evaluate.PNG_NAME)
    print(f"evaluation -> {', '.join(str(out_dir / name) for name in names)}", flush=True)
    return report


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values at each index (of all so far, before there are that
    many).

    >>> smoothed(np.array([1.0, 3.0, 2.0, 6.0]), 2).tolist()
    [1.0, 2.0, 2.5, 4.0]
    """
    total = np.cumsum(values)
    counts = np.minimum(np.arange(1, values.size + 1), window)
    shifted = np.concatenate([np.zeros(window), total])[: values.size]
    return (total - shifted) / counts


def plot_learning_curve(
    log_csv: Path, png: Path, horizon: int, rollout_len: int, levels: Mapping[str, float]
) -> None:
    """From the CSV log, against env steps. Top, in return per episode: the training reward per
    env step × `horizon`, averaged over the last horizon / rollout_len Steps (one episode's
    length, so every phase of an episode counts once); the mean return of the episodes that
    ended (markers; every market ends its episode at the same Step); and each policy's return
    on the held-out markets (`levels`, greedy for the trained one) as a reference line. The
    y axis spans the smoothed curve, the episodes and the trained policy's level, widened to
    take in the levels within that span again; a level beyond (random actions lose tens of
    times more than anything else makes) says so in the legend. Bottom: the total loss."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with log_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    steps = np.array([float(r["env_steps"]) for r in rows])
    figure = Figure(figsize=(11, 7))
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True)
    window = max(1, round(horizon / rollout_len))
    reward = np.array([float(r["reward_per_step"]) for r in rows]) * horizon
    curve = smoothed(reward, window)
    top.plot(steps, reward, color="0.75", linewidth=0.8, label="per Step (sampled actions)")
    top.plot(steps, curve, color="black", linewidth=2.2, zorder=10,
             label=f"mean of the last {window} Steps")  # fmt: skip
    ended = [(s, float(r["episode_return"])) for s, r in zip(steps, rows, strict=True)
             if r["episode_return"]]  # fmt: skip
    if ended:
        top.plot(*zip(*ended, strict=True), "o", color="black", zorder=11,
                 label="episodes that ended")  # fmt: skip
    core = [*curve, *(value for _, value in ended)]
    core += [levels[evaluate.TRAINED]] if evaluate.TRAINED in levels else []
    lo, hi = min(core), max(core)
    span = max(hi - lo, 1e-6)
    near = [v for v in levels.values() if lo - span <= v <= hi + span]
    low, high = min(lo, *near), max(hi, *near)
    top.set_ylim(low - 0.05 * (high - low + 1e-6), high + 0.05 * (high - low + 1e-6))
    styles = {name: {"color": color, "linestyle": dash, "linewidth": 1.4}
              for name, (color, dash, _) in zip(
                  [n for n in levels if n != evaluate.TRAINED],
                  itertools.cycle(evaluate.STYLES), strict=False)}  # fmt: skip
    styles[evaluate.TRAINED] = {"color": "black", "linestyle": (0, (1, 1)), "linewidth": 1.6,
                                "zorder": 5}  # over a baseline at the same level
    for name, level in sorted(levels.items(), key=lambda item: item[0] == evaluate.TRAINED):
        where = "held out" if low <= level <= high else "held out; off the scale"
        top.axhline(level, label=f"{name}: {level:.2f} ({where})", **styles[name])
    top.set_ylabel("return per episode (ticks)")
    top.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    loss = [(s, float(r["loss_total"])) for s, r in zip(steps, rows, strict=True)
            if r["loss_total"]]  # fmt: skip
    if loss:
        bottom.plot(*zip(*loss, strict=True), color="black")
    bottom.set_ylabel("total loss")
    bottom.set_xlabel("env steps")
    top.set_title("trident train --env lobsim: training reward against the held-out returns")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=100)
