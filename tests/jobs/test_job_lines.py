"""What a training job prints tells the truth: a resumed job's env steps/s and "trained N steps
in S s" count this process's Steps and time (the CSV's elapsed_s carries on from the
checkpoint); every log line reports all the episodes that ended since the line before. The
printed numbers are checked against the job's own CSV rows, not against a clock."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from service.cli import main
from service.config import load_config

SMALL = (
    '[model]\nhidden_dim = 16\n[train]\nbackend = "numpy"\nsteps = 8\nlog_every = 1\n'
    "num_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
    "[lobsim]\nhorizon = 6\n[checkpoint]\nevery_steps = 4\n"
)
LINE = re.compile(r"step (\d+)/\d+ \| (\d+) (?:env steps|samples)/s \| (.*)")


@pytest.fixture(autouse=True)
def _no_trident_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("TRIDENT_")]:
        monkeypatch.delenv(name)


def rows(run: Path) -> dict[int, dict[str, str]]:
    with (run / "train.csv").open(newline="") as handle:
        return {int(row["step"]): row for row in csv.DictReader(handle)}


def log_lines(out: str) -> dict[int, tuple[int, str]]:
    """step -> (printed rate, the rest of its line)."""
    return {int(m[1]): (int(m[2]), m[3]) for m in map(LINE.match, out.splitlines()) if m}


def episodes_between(table: dict[int, dict[str, str]], after: int, upto: int) -> tuple[int, float]:
    """Episodes ended in Steps after..upto and their mean return, from the CSV."""
    picked = [table[s] for s in range(after + 1, upto + 1) if table[s]["episodes"] != "0"]
    count = sum(int(r["episodes"]) for r in picked)
    total = sum(int(r["episodes"]) * float(r["episode_return"]) for r in picked)
    return count, total / count if count else 0.0


def assert_episodes_match(line: str, count: int, mean: float) -> None:
    if count == 0:
        assert "no episode ended" in line, line
        return
    printed = re.search(r"episode return (-?[\d.]+) \((\d+) ended\)", line)
    assert printed is not None, line
    assert int(printed[2]) == count and float(printed[1]) == pytest.approx(mean, abs=0.006)


def test_a_resumed_lobsim_job_rates_its_own_steps_and_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "small.toml").write_text(SMALL)
    run = tmp_path / "run"
    assert main(["train", "--config", str(tmp_path / "small.toml"), "--run-dir", str(run),
                 "--no-checkpoint", "--set", "ppo.gae_lambda=0.95"]) == 0  # fmt: skip
    capsys.readouterr()
    used = load_config(run / "config.toml", env={})  # the file and --set over the job's own
    assert (used.train.rollout_len, used.ppo.gae_lambda, used.optim.lr) == (4, 0.95, 2e-3)
    # resumed from the periodic checkpoint of Step 8, whose elapsed_s is row 8's
    assert main(["train", "--resume", "--run-dir", str(run), "--no-checkpoint",
                 "--set", "train.steps=14", "--set", "train.log_every=2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "resumed from step-0000000008 at step 8" in out
    table, lines = rows(run), log_lines(out)
    assert sorted(lines) == [10, 12, 14]
    ran = {s: float(table[s]["elapsed_s"]) - float(table[8]["elapsed_s"]) for s in lines}
    assert all(float(table[s]["elapsed_s"]) > ran[s] > 0 for s in lines)  # the CSV carries on
    samples = 8 * 4
    for step, (rate, rest) in lines.items():
        own = (step - 8) * samples / ran[step]
        assert rate == pytest.approx(own, rel=1e-3, abs=1), (step, rate, own)
        assert_episodes_match(rest, *episodes_between(table, step - 2, step))
    (final,) = re.findall(r"trained (\d+) steps in ([\d.]+) s", out)
    assert int(final[0]) == 6
    assert float(final[1]) == pytest.approx(ran[14], abs=0.051)


def test_gymnasium_log_lines_count_every_episode_since_the_last_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gymnasium")
    run = tmp_path / "run"
    assert main(["train", "--env", "gymnasium:CartPole-v1", "--set", "train.steps=6",
                 "--set", "train.num_envs=4", "--set", "train.rollout_len=16",
                 "--set", "train.log_every=3", "--set", "model.hidden_dim=16",
                 "--run-dir", str(run), "--no-checkpoint"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    table, lines = rows(run), log_lines(out)
    assert sorted(lines) == [3, 6]
    for step, (_, rest) in lines.items():
        count, mean = episodes_between(table, step - 3, step)
        assert count > int(table[step]["episodes"])  # more than the line's own Step ended
        assert_episodes_match(rest, count, mean)
    assert "evaluation 4/4: random played 100 episodes (400/400 episodes" in out


def test_bandit_log_lines_count_every_step_since_the_last_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--env", "bandit", "--set", "train.steps=6", "--set",
                 "train.num_envs=16", "--set", "train.rollout_len=4", "--set",
                 "train.log_every=3", "--set", "model.hidden_dim=16", "--run-dir",
                 str(tmp_path / "run"), "--no-checkpoint"]) == 0  # fmt: skip
    lines = log_lines(capsys.readouterr().out)
    assert sorted(lines) == [3, 6]
    assert all("over the 192 one-step episodes since the last line" in rest
               for _, rest in lines.values())  # fmt: skip
