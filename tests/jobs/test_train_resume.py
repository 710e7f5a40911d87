"""`trident train` stopped, then resumed with `--resume --run-dir`, goes on exactly: stopped by
SIGINT (the job saves a checkpoint at the interrupt) or SIGKILL (the periodic checkpoint holds
less than the log), the resumed run's log rows and final evaluation equal those of a run that
never stopped, byte for byte (`elapsed_s` aside, which goes on from the checkpoint's). A real
process each time, on the NumPy backend, as a user runs it."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from service.checkpoint import list_checkpoints, read_manifest

pytestmark = pytest.mark.slow

STEPS = 40
SMALL = (
    '[model]\nhidden_dim = 16\n[train]\nbackend = "numpy"\n'
    f"steps = {STEPS}\nlog_every = 1\nnum_envs = 8\nrollout_len = 4\n"
    "[replay]\nmin_size = 16\nbatch_size = 16\n[lobsim]\nhorizon = 6\n"
    "[checkpoint]\nevery_steps = 4\n"
)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", "train", *args]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}


def stopped_at(cwd: Path, run: str, line: str, signum: signal.Signals) -> subprocess.Popen[str]:
    """A run started and sent `signum` once it printed a line starting with `line`."""
    proc = subprocess.Popen(
        command("--config", "small.toml", "--run-dir", run), cwd=cwd, env=environment(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for printed in proc.stdout:
        if printed.startswith(line):
            proc.send_signal(signum)
            break
    return proc


def rows(run: Path) -> list[dict[str, str]]:
    with (run / "train.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def resume(cwd: Path, run: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command("--resume", "--run-dir", run), cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def assert_same_run(straight: Path, resumed: Path, stopped_step: int) -> None:
    """Every row equal to the straight run's but elapsed_s, which only grows; the same
    evaluation; the same final parameters."""
    want, got = rows(straight), rows(resumed)
    assert [r["step"] for r in got] == [str(s) for s in range(1, STEPS + 1)]
    strip = lambda row: {k: v for k, v in row.items() if k != "elapsed_s"}  # noqa: E731
    assert [strip(r) for r in got] == [strip(r) for r in want]
    elapsed = [float(r["elapsed_s"]) for r in got]
    assert elapsed == sorted(elapsed), f"elapsed_s went back after step {stopped_step}"
    assert (resumed / "eval.json").read_bytes() == (straight / "eval.json").read_bytes()
    digests = [read_manifest(list_checkpoints(run / "checkpoints")[0].path)["param_digest"]
               for run in (straight, resumed)]  # fmt: skip
    assert digests[0] == digests[1]


def test_a_run_stopped_by_sigint_or_sigkill_resumes_exactly(tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text(SMALL)
    straight = subprocess.run(command("--config", "small.toml", "--run-dir", "straight"),
                              cwd=tmp_path, env=environment(), capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    assert straight.returncode == 0, straight.stderr

    # SIGINT: the Step in progress ends, a checkpoint is saved there, one line says how to go on
    proc = stopped_at(tmp_path, "interrupted", "step 5/", signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err == "", err
    last = out.splitlines()[-1]
    assert last.startswith("trident train: stopped by SIGINT at step "), last
    assert last.endswith("Go on with: trident train --resume --run-dir interrupted")
    step = int(last.split(" at step ")[1].split("/")[0])
    assert (tmp_path / "interrupted" / "checkpoints" / f"step-{step:010d}").is_dir()
    assert len(rows(tmp_path / "interrupted")) == step
    done = resume(tmp_path, "interrupted")
    assert f"resumed from step-{step:010d} at step {step}" in done.stdout
    assert_same_run(tmp_path / "straight", tmp_path / "interrupted", step)

    # SIGKILL: the log ran past the newest checkpoint; the resumed run cuts it back
    proc = stopped_at(tmp_path, "killed", "step 10/", signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    written = len(rows(tmp_path / "killed"))
    newest = list_checkpoints(tmp_path / "killed" / "checkpoints")[0]
    assert written > newest.global_step and newest.global_step % 4 == 0
    resume(tmp_path, "killed")
    assert_same_run(tmp_path / "straight", tmp_path / "killed", newest.global_step)


def test_resume_of_a_missing_run_changes_nothing(tmp_path: Path) -> None:
    done = subprocess.run(command("--resume", "--run-dir", "nowhere"), cwd=tmp_path,
                          env=environment(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert "--resume: expected a checkpoint in nowhere/checkpoints" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_final_checkpoint_holds_the_markets(tmp_path: Path) -> None:
    """What a resume reads: the markets' arrays and the job's clock beside the trainer."""
    (tmp_path / "small.toml").write_text(SMALL.replace(f"steps = {STEPS}", "steps = 2"))
    done = subprocess.run(command("--config", "small.toml", "--run-dir", "run"), cwd=tmp_path,
                          env=environment(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    final = list_checkpoints(tmp_path / "run" / "checkpoints")[0]
    files = json.loads((final.path / "manifest.json").read_text())["files"]
    assert "job.safetensors" in files
