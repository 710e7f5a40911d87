"""One run per run folder: `trident train --run-dir` of a folder that holds a run refuses, naming
the folder and the ways out, unless `--resume` goes on with it or `--overwrite` clears it first;
`trident eval` and `trident export` take a run folder for its newest checkpoint. The CLI's
`main` in-process (no signals here), in a fresh working directory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import fresh_seed

from service.checkpoint import list_checkpoints, load_policy
from service.cli import main

BANDIT = ("--env", "bandit", "--set", "train.backend=numpy", "--set", "model.obs_dim=6",
          "--set", "model.hidden_dim=16", "--set", "train.steps=2", "--set", "train.num_envs=8",
          "--set", "train.rollout_len=4", "--set", "replay.min_size=16")  # fmt: skip
LOBSIM = ("--set", "train.backend=numpy", "--set", "model.hidden_dim=16", "--set",
          "train.steps=2", "--set", "train.num_envs=8", "--set", "train.rollout_len=4", "--set",
          "replay.min_size=16", "--set", "lobsim.horizon=6", "--set",
          "checkpoint.every_steps=1")  # fmt: skip


Trident = Callable[..., "Done"]


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def trident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Trident]:
    """`trident ARGS` in tmp_path: its exit code and what it printed."""
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("TRIDENT_")]:
        monkeypatch.delenv(key)

    def run(*args: str) -> Done:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    yield run


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def test_a_folder_holding_a_run_takes_resume_or_overwrite(tmp_path: Path, trident: Trident) -> None:
    first_seed, second_seed = fresh_seed(20), fresh_seed(20) + 1
    (tmp_path / "run").mkdir()  # an empty folder is no run: a job may start there
    first = trident("train", *BANDIT, "--set", f"train.seed={first_seed}",
                    "--run-dir", "run")  # fmt: skip
    assert first.returncode == 0, first.stderr
    run = tmp_path / "run"
    (run / "notes.txt").write_text("mine")
    before = snapshot(run)

    for env in (BANDIT, ("--env", "lobsim")):
        again = trident("train", *env, "--run-dir", "run")
        assert again.returncode == 2
        assert again.stderr == (
            "trident: error: --run-dir run holds a run already (config.toml, checkpoints/): one "
            "run per folder. --resume goes on with it; --overwrite deletes it and starts "
            "afresh; or name another --run-dir\n"
        )
        assert snapshot(run) == before  # nothing written over
    both = trident("train", "--run-dir", "run", "--resume", "--overwrite")
    assert both.returncode == 2 and "--overwrite: expected it without --resume" in both.stderr
    assert snapshot(run) == before

    fresh = trident("train", *BANDIT, "--set", f"train.seed={second_seed}",
                    "--run-dir", "run", "--overwrite")  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.startswith("trident train: --overwrite: deleted the run in run "
                                   "(config.toml, checkpoints/)\n")  # fmt: skip
    (saved,) = list_checkpoints(run / "checkpoints")  # the first run's is gone
    assert load_policy(run / "checkpoints", saved.name)[0].train.seed == second_seed
    assert f"seed = {second_seed}" in (run / "config.toml").read_text()
    assert (run / "notes.txt").read_text() == "mine"  # what no run wrote stays


@pytest.mark.slow
def test_eval_and_export_take_a_run_folder_for_its_newest_checkpoint(
    tmp_path: Path, trident: Trident
) -> None:
    """The run's markets (its config.toml: a horizon other than the default) and its newest
    checkpoint: `trident eval RUN` writes the eval.json the run wrote."""
    train = trident("train", *LOBSIM, "--set", f"train.seed={fresh_seed(20)}",
                    "--run-dir", "run")  # fmt: skip
    assert train.returncode == 0, train.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    assert [c.name for c in list_checkpoints(checkpoints)] == ["step-0000000002",
                                                               "step-0000000001"]  # fmt: skip
    newest = "trident {}: run folder run: its newest checkpoint, step-0000000002 (step 2)"

    evaluated = trident("eval", "run", "--out-dir", "ev")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.splitlines()[:2] == [
        newest.format("eval"),
        "trident eval: checkpoint run/checkpoints/step-0000000002, 256 held-out markets, seed "
        f"{load_policy(checkpoints, 'step-0000000002')[0].train.seed + 1_000_003}, horizon 6",
    ]
    want = (tmp_path / "run" / "eval.json").read_bytes()
    assert (tmp_path / "ev" / "eval.json").read_bytes() == want

    exported = trident("export", "run")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines() == [
        newest.format("export"),
        "trident export: run/checkpoints/step-0000000002 -> step-0000000002.onnx",
    ]
    assert (tmp_path / "step-0000000002.onnx").stat().st_size > 0
    # the NAME form still names any checkpoint
    named = trident("export", "step-0000000001", "--checkpoint-dir", str(checkpoints),
                    "--out", "first.onnx")  # fmt: skip
    assert named.returncode == 0, named.stderr
    assert named.stdout == f"trident export: {checkpoints / 'step-0000000001'} -> first.onnx\n"


def test_eval_of_a_run_folder_without_a_checkpoint_says_so(
    tmp_path: Path, trident: Trident
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    done = trident("eval", "run")
    assert done.returncode == 2
    assert done.stderr == (
        "trident: error: CHECKPOINT: expected a run folder with a committed checkpoint (in "
        "run/checkpoints), got run, which holds none\n"
    )
