"""A training run's folder, runs/<name>/: everything `trident train` writes, in one place.

    runs/lobsim-20261201-181148/
        config.toml       every setting the run used (`--config` reads it back)
        train.csv         one row per Step (CSV_COLUMNS of service/jobs/train.py)
        train.png         the learning curve
        eval.json, eval.txt, eval.png   the evaluation against the baselines
        checkpoints/      unless checkpoint.dir is set
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from service.config import Config, with_checkpoint_dir

RUNS = Path("runs")  # where default run folders go, relative to the working directory


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

    def checkpoint_dir(self, config: Config) -> Path:
        """Where the run's checkpoints go: checkpoint.dir if set, else `checkpoints`."""
        return Path(with_checkpoint_dir(config, self.checkpoints).checkpoint.dir)

    def prepare(self, config: Config) -> Config:
        """Create the folder, write `config` to its config.toml (without credentials) and return
        it with checkpoint.dir defaulting to `checkpoints`. The file keeps checkpoint.dir as
        given, so `--config` on it starts a run that checkpoints into its own folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(config.to_toml())
        return with_checkpoint_dir(config, self.checkpoints)
