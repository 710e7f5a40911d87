"""`trident train --env lobsim`: train a market maker in-process, log it, compare it.

Act -> LobSim step -> Step on the configured backend, into a run folder (run_folder.py):
every Step appends a row to its CSV log (and to TensorBoard with `tensorboard`); on a terminal
a progress bar moves with each Step, and a line is printed every `train.log_every` Steps. At the
end: a checkpoint of the trained state, then one episode of held-out markets for the trained
greedy policy and the baselines, and the learning curve with the baselines' returns beside it.

Checkpoints hold the markets' state and the job's clock beside the trainer's (job.safetensors),
so `--resume` (the newest checkpoint, or a named one) goes on exactly where the run stopped:
the log is cut back to the checkpoint's Step (rows written after it, which the checkpoint does
not hold, go; TensorBoard purges them), `elapsed_s` continues, and every later row and the
final evaluation equal those of the run that never stopped. SIGINT or SIGTERM ends the Step in
progress, saves a checkpoint there, prints how to resume, and exits with code 130. During the
evaluation (the checkpoint is committed before it) it stops the evaluation where it is (none of
its files stay), keeps the checkpoint, prints the commands that evaluate it and exits with code
130: `--resume` of a run whose training is done redoes the evaluation, the same as the run that
never stopped.
"""

from __future__ import annotations

import csv
import itertools
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from service.backend.blas import single_blas_thread
from service.checkpoint import (
    read_job_state,
    restore_checkpoint,
    resumable,
    save_checkpoint,
)
from service.config import Config, LobsimConfig, with_overrides
from service.envs import LobSimVectorEnv
from service.errors import InvalidInput
from service.jobs import evaluate
from service.jobs.device_loop import DeviceLoop, LoopStep
from service.jobs.loop import (
    CSV_COLUMNS,
    Checkpoints,
    TrainingLoop,
    header,
    rollout_step,
)
from service.jobs.progress import Episodes
from service.jobs.run_folder import RunFolder, commit_trained
from service.jobs.scalars import ScalarLog
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, LobSim, feature_column, observation_dim
from service.signals import Stopped, raise_on_stop, stop_signals
from service.trainer.sizing import sized_backend
from service.trainer.trainer import Trainer
from service.types import ActMode, CheckpointInfo

HELD_OUT = 1_000_003  # evaluation seed = train.seed + this: markets training never saw


def lobsim_model(config: Config) -> Config:
    """`config` with the model's input and output sizes set to LobSim's, and a kickstart
    teacher's feature left at -1 set to LobSim's inventory column."""
    sizes = [
        f"model.obs_dim={observation_dim(config.lobsim)}",
        f"model.num_actions={NUM_ACTIONS}",
        f"model.aux_dim={LABEL_DIM}",
    ]
    if config.kickstart.feature == -1:
        sizes.append(f"kickstart.feature={feature_column(config.lobsim, 'inventory')}")
    return with_overrides(config, sizes)


def run_train_lobsim(
    config: Config,
    run_dir: Path,
    write_checkpoint: bool = True,
    resume: str | None = None,
    tensorboard: Path | None = None,
) -> int:
    """The main job into the run folder `run_dir`; `resume`: "latest" or a checkpoint name
    under checkpoint.dir, checked before anything is written; `tensorboard`: a directory for
    TensorBoard events too."""
    trainer, folder, name = start_run(lobsim_model(config), run_dir, resume)
    with single_blas_thread(trainer.backend.name):
        return _train_lobsim(trainer, folder, write_checkpoint, name, tensorboard)


def start_run(config: Config, run_dir: Path, resume: str | None) -> tuple[Trainer, RunFolder,
                                                                          str | None]:  # fmt: skip
    """A training job's trainer on its backend, its run folder prepared, and the checkpoint
    `resume` means ("latest" or a name), checked before anything is written."""
    config, backend = sized_backend(config, job=True)
    folder = RunFolder(run_dir)
    name = None if resume is None else checkpoint_to_resume(folder.checkpoint_dir(config), resume)
    config = folder.prepare(config)
    with single_blas_thread(backend.name):  # the trainer's first arrays too
        return Trainer(config, backend), folder, name


def checkpoint_to_resume(checkpoints: Path, resume: str) -> str:
    """The name --resume means: the newest valid checkpoint under `checkpoints` ("latest"), or
    the one named, which must exist; InvalidInput where there is none, NoValidCheckpoint where
    there are checkpoints and none validates."""
    if resume != "latest":
        if not (checkpoints / resume / "manifest.json").is_file():
            raise InvalidInput("--resume", f"a checkpoint of {checkpoints}", repr(resume))
        return resume
    # Checkpoints that do not validate are passed over with a warning (NoValidCheckpoint
    # where none validates: the run would otherwise start again from nothing).
    newest, invalid = resumable(checkpoints)
    for skipped in invalid:
        print(f"trident: warning: --resume skips checkpoint {skipped.name}: {skipped.reason}",
              file=sys.stderr, flush=True)  # fmt: skip
    if newest is None:
        raise InvalidInput(
            "--resume", f"a checkpoint in {checkpoints} (--run-dir: the run to continue)", "none"
        )
    return newest.name


def _train_lobsim(
    trainer: Trainer,
    folder: RunFolder,
    write_checkpoint: bool,
    resume: str | None,
    tensorboard: Path | None,
) -> int:
    config = trainer.config
    train_cfg, lob = config.train, config.lobsim
    job: dict[str, np.ndarray] | None = None
    saved: CheckpointInfo | None = None  # the newest checkpoint of this run's state
    if resume is not None:
        saved = info = restore_checkpoint(trainer, config.checkpoint.dir, resume)
        job = read_job_state(config.checkpoint.dir, resume)
        print(f"resumed from {info.name} at step {trainer.global_step}", flush=True)
        if job is None:
            print("note: the checkpoint holds no market state (written before jobs saved "
                  "theirs): the markets start afresh", flush=True)  # fmt: skip
    # Markets resumed from a job state are the run's own, seeded as it was; fresh ones after
    # an older checkpoint take a seed of their own.
    seed = train_cfg.seed + (0 if job is not None else trainer.global_step)
    markets = make_stepper(trainer, train_cfg.num_envs, train_cfg.rollout_len, lob, seed)
    elapsed_before = 0.0
    if job is not None:
        markets.load_state_dict({k: v for k, v in job.items() if not k.startswith("job/")})
        elapsed_before = float(job["job/elapsed_s"][0])
    saves = write_checkpoint or config.checkpoint.every_steps
    files = "config.toml, train.csv, train.png, eval.json, eval.txt, eval.png"
    print(header(trainer, "lobsim", f" horizon={lob.horizon}", folder, files, bool(saves),
                 tensorboard), flush=True)  # fmt: skip
    first = trainer.global_step
    episode_steps = lob.horizon / train_cfg.rollout_len

    def save(elapsed: float, replay: bool) -> CheckpointInfo:
        state = {**markets.state_dict(), "job/elapsed_s": np.array([elapsed])}
        return save_checkpoint(trainer, config.checkpoint.dir, job=state, replay=replay)

    def status(done: LoopStep, rate: float, ended: Episodes) -> str:
        return (f"{rate:.0f} env steps/s | reward/step {done.mean_reward:.3f} | loss "
                f"{done.result.losses.get('total', float('nan')):.3f}")  # fmt: skip

    def detail(done: LoopStep, ended: Episodes) -> str:
        episode = (ended.text() if ended.count else
                   f"no episode ended since the last line (one is {lob.horizon} env steps, "
                   f"{episode_steps:g} Steps)")  # fmt: skip
        losses = " ".join(f"{k} {v:.3f}" for k, v in done.result.losses.items() if k != "total")
        return f" | {episode} | {losses}"

    checkpoints = Checkpoints(trainer, save, saved)
    go_on = f". Go on with: trident train --resume --run-dir {folder.root}"
    with stop_signals() as stopping:
        resumed_at = first if resume is not None else None
        with ScalarLog(folder.log_csv, CSV_COLUMNS, resumed_at, tensorboard) as scalars:
            loop = TrainingLoop(trainer, markets, checkpoints, config.optim.lr, status, detail,
                                go_on, scalars, elapsed_before)  # fmt: skip
            if loop.run(stopping):
                return 130
        elapsed = loop.elapsed if trainer.global_step > first else elapsed_before
        final = commit_trained((lambda: checkpoints.now(elapsed)) if write_checkpoint else None,
                               checkpoints.saved, trainer.global_step)  # fmt: skip
        print(f"{loop.trained(first)}; log {folder.log_csv}; evaluating on held-out markets",
              flush=True)  # fmt: skip
        try:
            with raise_on_stop(stopping):
                report = compare_with_baselines(trainer, config, folder.root)
                levels = {name: row["return"].mean for name, row in report.metrics.items()}
                plot_learning_curve(folder.log_csv, folder.curve_png, lob.horizon,
                                    train_cfg.rollout_len, levels)  # fmt: skip
        except Stopped as stop:
            folder.drop_evaluation()
            print(evaluation_stopped(stop.signal, folder.root, final), flush=True)
            return 130
    print(f"learning curve -> {folder.curve_png}", flush=True)
    print(folder.size_line(config), flush=True)
    return 0


def evaluation_stopped(signal_name: str, run_dir: Path, final: CheckpointInfo | None) -> str:
    """What `trident train` says when a signal stops the evaluation: the checkpoint it kept
    and the commands that evaluate it (`trident eval` of the run folder: its newest
    checkpoint on its own markets; a resume: the run's own evaluation, eval files and curve)."""
    said = f"trident train: stopped by {signal_name} during the evaluation"
    if final is None:
        return (f"{said}; no checkpoint (--no-checkpoint): the trained policy is not kept. "
                "A run without --no-checkpoint commits one before it evaluates")  # fmt: skip
    return (f"{said}; training is done, checkpoint {final.name} kept. Evaluate it with: "
            f"trident eval {run_dir} --out-dir {run_dir}, or finish the run (its evaluation "
            f"and learning curve) with: trident train --resume --run-dir {run_dir}")  # fmt: skip


class MarketSteps:
    """The main job's Steps on `num_envs` markets of seed `seed`: each call runs a rollout of
    `horizon` steps under the trainer's sampled policy and one Step on it (on NumPy the host
    loop, the one remote actors run; on the GPU the device loop, where the markets live on the
    device too). `state_dict` / `load_state_dict` are the markets' state:
    what a resumed job restores to go on exactly where it stopped."""

    def __init__(
        self,
        trainer: Trainer,
        num_envs: int,
        horizon: int,
        cfg: LobsimConfig,
        seed: int,
    ) -> None:
        self.trainer, self.horizon = trainer, horizon
        self._host: LobSimVectorEnv | None = None
        if trainer.xp is np:
            self._host = LobSimVectorEnv(num_envs, cfg, seed)
            self.markets = self._host.env
        else:
            self.markets = LobSim(num_envs, cfg, seed, backend="cuda")
            self._device = DeviceLoop(trainer, self.markets, horizon)

    def __call__(self) -> LoopStep:
        if self._host is None:
            return self._device.step()
        return rollout_step(self.trainer, self._host, self.horizon)

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.markets.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if self._host is not None:
            self._host.load_state_dict(state)
        else:
            self.markets.load_state_dict(state)


def make_stepper(
    trainer: Trainer, num_envs: int, horizon: int, cfg: LobsimConfig, seed: int
) -> MarketSteps:
    """Steps of training on `num_envs` fresh markets, at the trainer's settings."""
    return MarketSteps(trainer, num_envs, horizon, cfg, seed)


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
        lambda env: act, config.lobsim, seed, train_seed, out_dir=out_dir, title="trident train",
        progress=sys.stdout,
    )  # fmt: skip
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
                                "zorder": 5}  # over a baseline at the same level  # fmt: skip
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
    figure.align_ylabels([top, bottom])
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    # bbox_inches="tight": the saved area takes in every artist, the legend outside the axes
    # and each axes' y label whatever the width of its tick labels
    figure.savefig(png, dpi=100, bbox_inches="tight", pad_inches=0.1)
