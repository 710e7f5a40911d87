"""`trident train` stopped while it evaluates loses nothing it trained: the checkpoint is
committed when training ends, SIGINT or SIGTERM then exits 130 without a traceback and prints
the commands that evaluate it, and `--resume` of the run only evaluates, writing the eval.json
of a run that never stopped. Real processes, on the NumPy backend, as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import fresh_seed, wait_until

from service.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

# A LobSim job of a few small Steps; its evaluation plays lobsim.horizon steps per market.
SMALL = ("train.backend=numpy", "model.hidden_dim=16", "train.num_envs=8", "train.rollout_len=4",
         "train.log_every=1", "replay.min_size=16", "replay.batch_size=16")  # fmt: skip
GYM = ("train.steps=3", "train.num_envs=4", "train.rollout_len=16", "train.log_every=1",
       "model.hidden_dim=16")  # fmt: skip
LINE_TIMEOUT_S = 120.0


def sets(*settings: str) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}


def trident(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd,
                          env=environment(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


class Job:
    """A running `trident` process; a thread gathers its stdout lines as they come."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.err = (cwd / "stderr.txt").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args], cwd=cwd, env=environment(),
            stdout=subprocess.PIPE, stderr=self.err, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def signal_at(self, prefix: str, signum: signal.Signals) -> None:
        """Send `signum` once the process printed a line starting with `prefix`."""
        wait_until(lambda: any(line.startswith(prefix) for line in self.lines),
                   LINE_TIMEOUT_S, lambda: f"a line {prefix!r} in {self.lines}")  # fmt: skip
        self.proc.send_signal(signum)

    def finish(self) -> tuple[int, list[str], str]:
        """Exit code, stdout lines and stderr, once the process ended."""
        try:
            code = self.proc.wait(LINE_TIMEOUT_S)
        finally:
            self.proc.kill()
            self.reader.join(10)
        self.err.seek(0)
        return code, self.lines, self.err.read()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_during_the_evaluation_keeps_the_checkpoint(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Markets so long that the evaluation would take minutes: the signal, sent once it has
    begun, stops it where it is."""
    seed = fresh_seed(20)
    settings = sets(*SMALL, "train.steps=2", "lobsim.horizon=4000", f"train.seed={seed}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval.json").write_text("{}\n")  # as an earlier evaluation would leave it
    job = Job(tmp_path, "train", "--run-dir", "run", *settings)
    job.signal_at("evaluation: ", signum)
    code, lines, err = job.finish()
    assert (code, err) == (130, ""), (code, err)
    assert lines[-1] == (
        f"trident train: stopped by {signum.name} during the evaluation; training is done, "
        "checkpoint step-0000000002 kept. Evaluate it with: trident eval run --out-dir run, "
        "or finish the run (its evaluation and learning curve) with: trident train --resume "
        "--run-dir run"
    )
    (saved,) = list_checkpoints(run / "checkpoints")
    assert saved.global_step == 2 and saved.name == "step-0000000002"
    assert any(line.startswith(f"checkpoint {saved.name} -> run/checkpoints/{saved.name} (")
               for line in lines), lines  # fmt: skip
    # the evaluation did not finish: no file of it stays, partial or earlier
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.toml", "train.csv"]


def test_with_no_checkpoint_a_stop_during_the_evaluation_says_nothing_is_kept(
    tmp_path: Path,
) -> None:
    settings = sets(*SMALL, "train.steps=2", "lobsim.horizon=4000", f"train.seed={fresh_seed(20)}")
    job = Job(tmp_path, "train", "--run-dir", "run", "--no-checkpoint", *settings)
    job.signal_at("evaluation: ", signal.SIGINT)
    code, lines, err = job.finish()
    assert (code, err) == (130, ""), (code, err)
    assert lines[-1] == (
        "trident train: stopped by SIGINT during the evaluation; no checkpoint "
        "(--no-checkpoint): the trained policy is not kept. A run without --no-checkpoint "
        "commits one before it evaluates"
    )
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.toml", "train.csv"]


def test_a_resume_after_a_stopped_evaluation_evaluates_as_an_unstopped_run(
    tmp_path: Path,
) -> None:
    seed = fresh_seed(20)
    settings = sets(*SMALL, "train.steps=3", "lobsim.horizon=6", f"train.seed={seed}")
    straight = trident(tmp_path, "train", "--run-dir", "straight", *settings)
    assert straight.returncode == 0, straight.stderr

    job = Job(tmp_path, "train", "--run-dir", "stopped", *settings)
    job.signal_at("evaluation: ", signal.SIGINT)
    code, lines, err = job.finish()
    assert (code, err) == (130, ""), (code, err)
    assert "Evaluate it with: trident eval stopped --out-dir stopped" in lines[-1], lines[-1]
    stopped = tmp_path / "stopped"
    assert not (stopped / "eval.json").exists() and not (stopped / "train.png").exists()

    done = trident(tmp_path, "train", "--resume", "--run-dir", "stopped")
    assert done.returncode == 0, done.stderr
    assert "resumed from step-0000000003 at step 3" in done.stdout
    assert "training done at step 3/3;" in done.stdout
    want = tmp_path / "straight" / "eval.json"
    assert (stopped / "eval.json").read_bytes() == want.read_bytes()
    assert (stopped / "train.png").read_bytes().startswith(b"\x89PNG")
    # the checkpoint the resume evaluated is the one the stopped run committed, not a new one
    assert [c.name for c in list_checkpoints(stopped / "checkpoints")] == ["step-0000000003"]


def test_a_gym_run_stopped_after_training_is_evaluated_by_its_resume(tmp_path: Path) -> None:
    """The signal lands after the training's checkpoint (the line that says evaluating comes
    after it): before or during the evaluation, either way the evaluation is the resume's."""
    pytest.importorskip("gymnasium")
    settings = sets(*GYM, f"train.seed={fresh_seed(20)}")
    env = ("--env", "gymnasium:CartPole-v1")
    straight = trident(tmp_path, "train", *env, "--run-dir", "straight", *settings)
    assert straight.returncode == 0, straight.stderr

    job = Job(tmp_path, "train", *env, "--run-dir", "stopped", *settings)
    job.signal_at("trained 3 steps", signal.SIGTERM)
    code, lines, err = job.finish()
    assert (code, err) == (130, ""), (code, err)
    go_on = "trident train --env gymnasium:CartPole-v1 --resume --run-dir stopped"
    assert lines[-1] == (
        "trident train: stopped by SIGTERM during the evaluation; training is done, "
        f"checkpoint step-0000000003 kept. Evaluate it with: {go_on}"
    )
    stopped = tmp_path / "stopped"
    assert not (stopped / "eval.json").exists()

    done = trident(tmp_path, *go_on.split()[1:])
    assert done.returncode == 0, done.stderr
    assert "training done at step 3/3;" in done.stdout
    want = tmp_path / "straight" / "eval.json"
    assert (stopped / "eval.json").read_bytes() == want.read_bytes()
    assert [c.name for c in list_checkpoints(stopped / "checkpoints")] == ["step-0000000003"]
