"""Every `trident train` job anneals its learning rate as train.lr_schedule says: the k-th of
S Steps (k from 0) runs at optim.lr x (1 - k / S) when linear, at optim.lr when constant. The
bandit's job did not apply the schedule before the jobs shared one loop (service/jobs/loop.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.cli import main
from service.trainer.trainer import Trainer

STEPS, LR = 4, 3e-3
SMALL = ("--set", "train.backend=numpy", "--set", "model.hidden_dim=16", "--set",
         f"train.steps={STEPS}", "--set", "train.num_envs=8", "--set", "train.rollout_len=4",
         "--set", "replay.min_size=16", "--set", f"optim.lr={LR}", "--no-checkpoint")  # fmt: skip
JOBS = {
    "lobsim": ("--set", "lobsim.horizon=6"),
    "bandit": ("--env", "bandit", "--set", "model.obs_dim=6"),
    "gymnasium": ("--env", "gymnasium:CartPole-v1"),
}


@pytest.mark.parametrize("schedule", ["linear", "constant"])
@pytest.mark.parametrize("job", list(JOBS))
def test_every_job_anneals_as_the_schedule_says(
    job: str, schedule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if job == "gymnasium":
        pytest.importorskip("gymnasium")
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("TRIDENT_")]:
        monkeypatch.delenv(key)
    rates: list[float] = []
    step = Trainer.step

    def recording(self: Trainer, *args: object, **kwargs: object) -> object:
        rates.append(self.config.optim.lr)
        return step(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Trainer, "step", recording)
    args = ["train", *JOBS[job], *SMALL, "--set", f"train.lr_schedule={schedule}",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(args) == 0
    if schedule == "linear":
        assert rates == pytest.approx([LR * (1 - k / STEPS) for k in range(STEPS)])
    else:
        assert rates == [LR] * STEPS
