"""Integrated trainer behaviour: determinism, the non-finite guard, validation, Act, hyperparams."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_rollout, random_steps, small_config

from service.errors import InvalidInput
from service.trainer.trainer import Trainer
from service.types import ActMode, Rollout


def test_same_seed_same_digest_other_seed_differs(seed: int) -> None:
    first, second = Trainer(small_config()), Trainer(small_config())
    other = Trainer(small_config("train.seed=1"))
    for trainer in (first, second, other):
        results = random_steps(trainer, seed, 6)
    assert all(r.losses.get("q") is not None for r in results[-2:]), "Q head never trained"
    assert first.param_digest() == second.param_digest()
    assert first.param_digest() != other.param_digest()
    for name, array in first.state_dict().items():
        assert array.tobytes() == second.state_dict()[name].tobytes(), name


def test_step_changes_every_trained_group(seed: int) -> None:
    trainer = Trainer(small_config())
    before = {k: v.copy() for k, v in trainer.state.params.items()}
    random_steps(trainer, seed, 6)
    for name, value in trainer.state.params.items():
        assert not np.array_equal(value, before[name]), f"{name} never moved"


@pytest.mark.parametrize("field", ["rewards", "obs", "behavior_log_probs", "aux_targets"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_skips_the_whole_step(
    field: str, bad: float, seed: int, rng: np.random.Generator
) -> None:
    trainer = Trainer(small_config())
    random_steps(trainer, seed + 1, 5)
    rollout = random_rollout(rng)
    getattr(rollout, field).reshape(-1)[3] = bad
    before = {k: v.copy() for k, v in trainer.state_dict().items()}
    digest = trainer.param_digest()
    result = trainer.step(rollout)
    assert result.skipped and field in result.skip_reason
    assert trainer.param_digest() == digest
    for name, array in trainer.state_dict().items():
        assert array.tobytes() == before[name].tobytes(), name


def test_non_finite_gradient_skips_the_update_untouched(rng: np.random.Generator) -> None:
    # Huge rewards overflow the float32 value loss: the guard must leave parameters alone.
    trainer = Trainer(small_config())
    rollout = random_rollout(rng)
    rollout.rewards[...] = np.float32(3e38)
    digest = trainer.param_digest()
    result = trainer.step(rollout)
    assert result.skipped and result.updates_applied == 0
    assert "non-finite" in result.skip_reason
    assert trainer.param_digest() == digest
    assert trainer.global_step == 0


@pytest.mark.parametrize(
    ("field", "mutate", "message"),
    [
        ("obs", lambda r: {"obs": r.obs[:, :, :4]}, "[T+1, N, D]"),
        ("actions", lambda r: {"actions": r.actions + 9}, "[0, 9)"),
        ("actions", lambda r: {"actions": r.actions.astype(np.float32)}, "integer"),
        ("rewards", lambda r: {"rewards": r.rewards[:-1]}, "[T, N]"),
        ("terminated", lambda r: {"terminated": r.terminated.astype(np.int8) * 2}, "{0, 1}"),
        ("final_obs_index", lambda r: {"final_obs_index": r.final_obs_index + 1}, "truncated"),
        ("aux_targets", lambda r: {"aux_targets": r.aux_targets[..., :2]}, "[T, N, K]"),
        ("bce_labels", lambda r: {"bce_labels": r.bce_labels.astype(np.float32)}, "bool"),
    ],
)
def test_bad_rollout_is_rejected_without_change(field, mutate, message, rng) -> None:
    trainer = Trainer(small_config())
    rollout = random_rollout(rng)
    while not (rollout.truncated.any() and rollout.terminated.any()):  # so that every
        rollout = random_rollout(rng)  # mutation above changes something
    fields = {**rollout.__dict__, **mutate(rollout)}
    digest = trainer.param_digest()
    with pytest.raises(InvalidInput) as caught:
        trainer.step(Rollout(**fields))
    assert caught.value.field == field
    assert message in str(caught.value)
    assert trainer.param_digest() == digest and len(trainer.state.replay) == 0


def reference_forward(trainer: Trainer, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Policy log-probs, E[Z] and V recomputed in float64 with plain NumPy from the trainer's
    saved parameters (V = σ v̂ + μ, the return statistics' debiased moving averages)."""
    p = {k.removeprefix("params/"): v for k, v in trainer.state_dict().items()
         if k.startswith("params/")}  # fmt: skip
    a, b, c = p["v/norm"]
    mean, std = 0.0, 1.0  # before the first Step, or without value normalisation
    if trainer.config.ppo.value_norm and c > 0:
        mean = a / c
        std = np.sqrt(max(b / c - mean * mean, 1e-2))
    h = obs.astype(np.float64)
    for layer in range(trainer.config.model.depth):
        h = np.maximum(h @ p[f"encoder/W{layer}"] + p[f"encoder/b{layer}"], 0)
    logits = h @ p["pi/W"] + p["pi/b"]
    log_pi = logits - logits.max(1, keepdims=True)
    log_pi -= np.log(np.exp(log_pi).sum(1, keepdims=True))
    q_logits = (h @ p["q/W"] + p["q/b"]).reshape(len(obs), 9, 51)
    q_probs = np.exp(q_logits - q_logits.max(-1, keepdims=True))
    q_probs /= q_probs.sum(-1, keepdims=True)
    return {
        "log_pi": log_pi,
        "q_values": q_probs @ np.linspace(-10, 10, 51),
        "values": std * ((h @ p["v/W"])[:, 0] + p["v/b"]) + mean,
    }


def test_act_modes(seed: int, rng: np.random.Generator) -> None:
    trainer = Trainer(small_config())
    random_steps(trainer, seed, 4)
    obs = rng.standard_normal((257, 6)).astype(np.float32)
    ref = reference_forward(trainer, obs)
    sample = trainer.act(obs, ActMode.SAMPLE)
    assert sample.actions.shape == (257,) and sample.actions.dtype == np.int32
    assert sample.policy_version == trainer.global_step == 4
    rows = np.arange(257)
    np.testing.assert_allclose(sample.log_probs, ref["log_pi"][rows, sample.actions], atol=1e-5)
    np.testing.assert_allclose(sample.values, ref["values"], rtol=1e-4, atol=1e-5)
    greedy_pi = trainer.act(obs, ActMode.GREEDY_PI)
    assert np.array_equal(greedy_pi.actions, np.argmax(ref["log_pi"], 1))
    greedy_q = trainer.act(obs, ActMode.GREEDY_Q)
    assert np.mean(greedy_q.actions == np.argmax(ref["q_values"], 1)) > 0.99  # float32 ties
    assert np.array_equal(
        trainer.act(obs, ActMode.EPSILON_GREEDY, epsilon=0.0).actions, greedy_q.actions
    )
    explored = trainer.act(obs, ActMode.EPSILON_GREEDY, epsilon=1.0).actions
    assert len(np.unique(explored)) == 9 and np.mean(explored != greedy_q.actions) > 0.7


def test_act_sampling_follows_the_policy_and_is_reproducible(rng: np.random.Generator) -> None:
    first, second = Trainer(small_config()), Trainer(small_config())
    context = rng.standard_normal((1, 6)).astype(np.float32)
    obs = np.repeat(context, 20000, axis=0)
    a = first.act(obs, ActMode.SAMPLE)
    assert np.array_equal(a.actions, second.act(obs, ActMode.SAMPLE).actions)
    frequencies = np.bincount(a.actions, minlength=9) / a.actions.size
    policy = np.exp(reference_forward(first, context)["log_pi"][0])
    np.testing.assert_allclose(frequencies, policy, atol=0.015)
    assert not np.array_equal(first.act(obs, ActMode.SAMPLE).actions, a.actions)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((np.zeros((3, 5), np.float32),), "obs"),
        ((np.full((3, 6), np.nan, np.float32),), "obs"),
        ((np.ones((3, 6), np.float32), "greedy"), "mode"),
        ((np.ones((3, 6), np.float32), ActMode.EPSILON_GREEDY, 1.5), "epsilon"),
    ],
)
def test_act_rejects_bad_input(args, field) -> None:
    trainer = Trainer(small_config())
    with pytest.raises(InvalidInput) as caught:
        trainer.act(*args)
    assert caught.value.field == field
    assert int(trainer.state.counters["act_calls"][0]) == 0


def test_update_hyperparams() -> None:
    trainer = Trainer(small_config())
    trainer.update_hyperparams({"optim.lr": 1e-3, "train.gamma": 0.5})
    assert trainer.config.optim.lr == 1e-3 and trainer.config.train.gamma == 0.5
    with pytest.raises(InvalidInput, match=r"model\.hidden_dim"):
        trainer.update_hyperparams({"model.hidden_dim": 3})
    with pytest.raises(InvalidInput, match=r"train\.gamma"):
        trainer.update_hyperparams({"optim.lr": 1e-2, "train.gamma": 2.0})
    assert trainer.config.optim.lr == 1e-3  # all or nothing
    with pytest.raises(InvalidInput, match=r"optim\.lr > 0") as caught:  # 0: the backend's rate
        trainer.update_hyperparams({"optim.lr": 0.0, "train.gamma": 0.9})
    assert caught.value.field == "hyperparams"
    assert (trainer.config.optim.lr, trainer.config.train.gamma) == (1e-3, 0.5)


def test_policy_lag_is_reported(seed: int, rng: np.random.Generator) -> None:
    trainer = Trainer(small_config())
    random_steps(trainer, seed, 3)
    rollout = random_rollout(rng)
    result = trainer.step(Rollout(**{**rollout.__dict__, "policy_version": 1}))
    assert result.policy_lag == 2 and result.global_step == 4
