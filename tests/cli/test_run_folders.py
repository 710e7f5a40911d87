"""Where runs land: `trident train`'s run folder (service/jobs/run_folder.py), its config.toml,
and `trident serve`'s own checkpoint folder when checkpoint.dir is left empty."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from service.config import Config, load_config
from service.jobs.run_folder import RUNS, RunFolder, new_run_dir
from service.server.app import start, stop
from tests.conftest import SMALL, small_config


def test_a_new_run_folder_is_named_for_the_env_and_the_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    now = dt.datetime(2026, 12, 1, 18, 11, 48, tzinfo=dt.UTC)
    first = new_run_dir("lobsim", now)
    assert first == RUNS / "lobsim-20261201-181148"
    first.mkdir(parents=True)
    second = new_run_dir("lobsim", now)  # two jobs in one second
    assert second == RUNS / "lobsim-20261201-181148-2"
    second.mkdir()
    assert new_run_dir("lobsim", now) == RUNS / "lobsim-20261201-181148-3"


def test_config_toml_reads_back_as_the_config_without_the_token(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    token = f"secret-{rng.integers(1 << 30)}"
    config = small_config(
        f"train.seed={rng.integers(1 << 30)}",
        f"optim.lr={rng.uniform(1e-5, 1e-2)!r}",
        f"lobsim.damping={rng.uniform(0, 1)!r}",
        "checkpoint.dir=a \"quoted\" \\ dir",
        f"server.auth_token={token}",
    )
    folder = RunFolder(tmp_path / "run")
    used = folder.prepare(config)
    assert used.checkpoint.dir == "a \"quoted\" \\ dir"  # set explicitly: it wins
    assert token not in folder.config.read_text()
    assert load_config(folder.config, env={}) == Config.from_dict(used.public_dict())
    other = RunFolder(tmp_path / "other")
    defaulted = other.prepare(small_config())
    assert defaulted.checkpoint.dir == str(tmp_path / "other" / "checkpoints")
    # Read back, a defaulted dir stays defaulted: a run from this file checkpoints into its own
    # folder, not into this one's (where its step-N names would collide).
    assert load_config(other.config, env={}).checkpoint.dir == ""


@pytest.mark.parametrize("explicit", [False, True])
def test_serve_keeps_checkpoints_apart_from_runs_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, explicit: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    chosen = ["checkpoint.dir=mine"] if explicit else []
    config = load_config(env={}, overrides=[*SMALL, "server.port=0", "server.metrics_port=0",
                                            "server.shutdown_grace_s=1", *chosen])  # fmt: skip
    running = start(config)
    try:
        expected = "mine" if explicit else "runs/serve-0/checkpoints"  # server.port 0
        assert running.engine.trainer.config.checkpoint.dir == expected
        assert running.engine.root == Path(expected)
        running.engine.update_hyperparams({"optim.lr": 1e-3})  # something new for the drain
    finally:
        stop(running, 0.0)
    # the drain's final checkpoint lands there, where a server restarted on the port looks
    assert list((tmp_path / expected).iterdir())
