"""A training run's folder, runs/<name>/: everything `trident train` writes, in one place.

    runs/lobsim-20261201-181148/
        config.toml       every setting the run used (`--config` reads it back)
        train.csv         one row per Step (CSV_COLUMNS of service/jobs/train.py)
        train.png         the learning curve
        eval.json, eval.txt, eval.png   the evaluation against the baselines
        checkpoints/      unless checkpoint.dir is set

One run per folder: a folder that holds a run already (`RunFolder.traces`) is gone on with
(`--resume`) or cleared first (`--overwrite`, `RunFolder.clear`), never written over, so that its
log, evaluation and checkpoints always belong to one run.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.config import Config, with_checkpoint_dir
from service.types import CheckpointInfo

RUNS = Path("runs")  # where default run folders go, relative to the working directory
# What a run writes into its folder, beside checkpoints/ (evaluate.py's names for the eval files)
# (the first two are the run's own; the others come with its evaluation)
RUN_FILES = ("config.toml", "train.csv", "train.png", "eval.json", "eval.txt", "eval.png")


def new_run_dir(env: str, now: dt.datetime | None = None) -> Path:
    """runs/<env>-<UTC time to the second>; -2, -3, ... appended where that folder exists (two
    jobs started within one second)."""
    stamp = f"{env}-{(now or dt.datetime.now(dt.UTC)):%Y%m%d-%H%M%S}"
    path, n = RUNS / stamp, 1
    while path.exists():
        n += 1
        path = RUNS / f"{stamp}-{n}"
    return path


@dataclass(frozen=True)
class RunFolder:
    """The paths of one run under `root`."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def log_csv(self) -> Path:
        return self.root / "train.csv"

    @property
    def curve_png(self) -> Path:
        return self.root / "train.png"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def traces(self) -> list[str]:
        """What marks the folder as a run's already: its config.toml, train.csv and
        checkpoints/ where present (checkpoints/ when it holds anything); empty: none."""
        found = [path.name for path in (self.config, self.log_csv) if path.exists()]
        if self.checkpoints.is_dir() and any(self.checkpoints.iterdir()):
            found.append(f"{self.checkpoints.name}/")
        return found

    def clear(self) -> None:
        """Delete what a run wrote here (RUN_FILES and checkpoints/); anything else stays."""
        for name in RUN_FILES:
            (self.root / name).unlink(missing_ok=True)
        if self.checkpoints.is_dir():
            shutil.rmtree(self.checkpoints)

    def drop_evaluation(self) -> None:
        """Delete the evaluation's files and the curve drawn with it: a stopped evaluation
        leaves none, neither partly written nor of an earlier checkpoint of the run."""
        for name in RUN_FILES[2:]:
            (self.root / name).unlink(missing_ok=True)

    def checkpoint_dir(self, config: Config) -> Path:
        """Where the run's checkpoints go: checkpoint.dir if set, else `checkpoints`."""
        return Path(with_checkpoint_dir(config, self.checkpoints).checkpoint.dir)

    def size_line(self, config: Config) -> str:
        """`run folder DIR: X MB (checkpoints: Y MB in N)`: what the run keeps on disk; its
        checkpoints counted where they are (in the folder, or checkpoint.dir)."""
        checkpoints = self.checkpoint_dir(config)
        inside = checkpoints.resolve().is_relative_to(self.root.resolve())
        count = sum(1 for c in checkpoints.iterdir() if (c / "manifest.json").is_file()) \
            if checkpoints.is_dir() else 0  # fmt: skip
        where = "" if inside else f" in {checkpoints}"
        return (
            f"run folder {self.root}: {megabytes(disk_bytes(self.root))} (checkpoints"
            f"{where}: {megabytes(disk_bytes(checkpoints))} in {count}; a finished run's "
            "last one leaves out the replay buffer, which resuming it does not need)"
        )

    def prepare(self, config: Config) -> Config:
        """Create the folder, write `config` to its config.toml (without credentials) and return
        it with checkpoint.dir defaulting to `checkpoints`. The file keeps checkpoint.dir as
        given, so `--config` on it starts a run that checkpoints into its own folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(config.to_toml())
        return with_checkpoint_dir(config, self.checkpoints)


def commit_trained(
    save: Callable[[], CheckpointInfo] | None, saved: CheckpointInfo | None, global_step: int
) -> CheckpointInfo | None:
    """The checkpoint that holds the trained state, committed before the evaluation, which a
    stop may cut short (a resume then finds the training done and only evaluates): `save()`'s,
    said on stdout, or with --no-checkpoint (`save` None) `saved` where it holds `global_step`
    (a periodic or restored one)."""
    if save is not None:
        final = save()
        print(f"checkpoint {final.name} -> {final.path} ({final.size_bytes} bytes)", flush=True)
        return final
    return saved if saved is not None and saved.global_step == global_step else None


def disk_bytes(path: Path) -> int:
    """The bytes of the files under `path` (0 where it does not exist)."""
    if not path.is_dir():
        return path.stat().st_size if path.is_file() else 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def megabytes(size: int) -> str:
    """`size` bytes as `X.Y MB` (10^6 bytes).

    >>> megabytes(46_100_608)
    '46.1 MB'
    """
    return f"{size / 1e6:.1f} MB"
