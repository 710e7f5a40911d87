"""`trident export --format onnx`: onnxruntime on the exported policy answers as Act does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from conftest import random_rollout, small_config

from service.checkpoint import save_checkpoint
from service.cli import main
from service.export import OUTPUTS
from service.trainer.trainer import Trainer
from service.trainer.value_norm import moments
from service.types import ActMode

ROWS = 1000
TOLERANCE = 1e-5


def trained(
    rng: np.random.Generator, steps: int, scale: float = 1.0, shift: float = 0.0,
    dtype: str = "float32",
) -> Trainer:  # fmt: skip
    """A small trainer in `dtype` after `steps` Steps on random rollouts with rewards
    `scale r + shift` (the return statistics follow)."""
    trainer = Trainer(small_config(f"model.dtype={dtype}"))
    for _ in range(steps):
        rollout = random_rollout(rng)
        rewards = (rollout.rewards * scale + shift).astype(np.float32)
        trainer.step(replace(rollout, rewards=rewards))
    return trainer


def exported(trainer: Trainer, tmp_path: Path) -> onnxruntime.InferenceSession:
    """The trainer's policy through a checkpoint and `trident export` of its folder, loaded in
    onnxruntime."""
    info = save_checkpoint(trainer, tmp_path / "ckpt", "policy")
    out = tmp_path / "policy.onnx"
    assert main(["export", str(info.path), "--format", "onnx", "--out", str(out)]) == 0
    return onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])


def assert_answers_as_act(trainer: Trainer, session: onnxruntime.InferenceSession,
                          obs: np.ndarray) -> None:  # fmt: skip
    assert [output.name for output in session.get_outputs()] == list(OUTPUTS)
    got = dict(zip(OUTPUTS, session.run(None, {"obs": obs}), strict=True))
    for mode, prefix in ((ActMode.GREEDY_PI, "greedy_pi"), (ActMode.GREEDY_Q, "greedy_q")):
        act = trainer.act(obs, mode)
        np.testing.assert_array_equal(got[f"{prefix}_action"], act.actions, err_msg=prefix)
        np.testing.assert_allclose(got[f"{prefix}_log_prob"], act.log_probs, rtol=0,
                                   atol=TOLERANCE, err_msg=prefix)  # fmt: skip
        # V is in return units: v̂'s last-bit differences (another GEMM's summation order) come
        # back multiplied by σ, so the bound is relative where |V| > 1
        np.testing.assert_allclose(got["value"], act.values, rtol=TOLERANCE, atol=TOLERANCE)
    rows = np.arange(len(obs))
    np.testing.assert_array_equal(got["log_probs"][rows, got["greedy_pi_action"]],
                                  got["greedy_pi_log_prob"])  # fmt: skip
    np.testing.assert_allclose(np.exp(got["log_probs"]).sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(got["greedy_q_action"], got["q_values"].argmax(axis=1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_onnx_policy_matches_act(rng: np.random.Generator, tmp_path: Path, dtype: str) -> None:
    trainer = trained(rng, steps=3, dtype=dtype)
    obs = rng.standard_normal((ROWS, trainer.config.model.obs_dim)).astype(dtype)
    assert_answers_as_act(trainer, exported(trainer, tmp_path), obs)


def test_onnx_value_is_denormalised(rng: np.random.Generator, tmp_path: Path) -> None:
    """Returns of tens of units: V = σ v̂ + μ is far from the head's output v̂."""
    trainer = trained(rng, steps=4, scale=30.0, shift=20.0)
    mean, std = moments(trainer.state.value_norm.stats)
    assert abs(mean) > 1 and std > 10, (mean, std)
    obs = rng.standard_normal((ROWS, trainer.config.model.obs_dim)).astype(np.float32)
    assert_answers_as_act(trainer, exported(trainer, tmp_path), obs)


def test_export_errors_name_what_is_wrong(
    rng: np.random.Generator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    save_checkpoint(trained(rng, steps=1), root, "policy")
    assert main(["export", "policy", "--format", "tflite", "--checkpoint-dir", str(root)]) == 2
    assert "--format: expected one of ['onnx'], got 'tflite'" in capsys.readouterr().err
    assert main(["export", "other", "--checkpoint-dir", str(root)]) == 2
    assert f"no checkpoint named 'other' in {root}" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.onnx"))
    out = tmp_path / "by-name.onnx"
    assert main(["export", "policy", "--checkpoint-dir", str(root), "--out", str(out)]) == 0
    assert out.is_file()
