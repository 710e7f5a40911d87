"""Integrated trainer behaviour: determinism, the non-finite guard, validation, Act, hyperparams."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import load_config
from service.errors import InvalidInput
from service.trainer.trainer import Trainer
from service.types import ActMode, Rollout

SMALL = [
    "train.backend=numpy",  # the CPU suite tests the NumPy backend, GPU or not
    "model.obs_dim=6",
    "model.hidden_dim=20",
    "replay.capacity=400",
    "replay.min_size=24",
    "replay.batch_size=12",
    "ppo.num_minibatches=3",
    "c51.target_update_period=3",
]


def make_trainer(*overrides: str) -> Trainer:
    return Trainer(load_config(env={}, overrides=[*SMALL, *overrides]))


def random_rollout(rng: np.random.Generator, T: int = 5, N: int = 6, D: int = 6) -> Rollout:
    truncated = rng.random((T, N)) < 0.15
    terminated = (rng.random((T, N)) < 0.15) & ~truncated
    truncated[0, 0], terminated[0, 0] = True, False  # at least one of each, so that every
    terminated[-1, -1], truncated[-1, -1] = True, False  # mutation below changes something
    index = np.flatnonzero(truncated.reshape(-1))
    return Rollout(
        obs=rng.standard_normal((T + 1, N, D)).astype(np.float32),
        actions=rng.integers(0, 9, (T, N)).astype(np.int32),
        rewards=rng.standard_normal((T, N)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        behavior_log_probs=(np.log(1 / 9) + 0.3 * rng.standard_normal((T, N))).astype(np.float32),
        final_obs=rng.standard_normal((index.size, D)).astype(np.float32),
        final_obs_index=index,
        bce_labels=rng.integers(0, 2, (T, N)).astype(np.uint8),
        aux_targets=rng.standard_normal((T, N, 3)).astype(np.float32),
    )


def run(trainer: Trainer, data_seed: int, steps: int) -> list:
    rng = np.random.default_rng(data_seed)
    return [trainer.step(random_rollout(rng)) for _ in range(steps)]


@pytest.fixture
def data_seed() -> int:
    seed = int(np.random.default_rng().integers(2**31))
    print(f"data seed {seed}")
    return seed


def test_same_seed_same_digest_other_seed_differs(data_seed: int) -> None:
    first, second, other = make_trainer(), make_trainer(), make_trainer("train.seed=1")
    for trainer in (first, second, other):
        results = run(trainer, data_seed, 6)
    assert all(r.losses.get("q") is not None for r in results[-2:]), "Q head never trained"
    assert first.param_digest() == second.param_digest()
    assert first.param_digest() != other.param_digest()
    for name, array in first.state_dict().items():
        assert array.tobytes() == second.state_dict()[name].tobytes(), name


def test_step_changes_every_trained_group(data_seed: int) -> None:
    trainer = make_trainer()
    before = {k: v.copy() for k, v in trainer.state.params.items()}
    run(trainer, data_seed, 6)
    for name, value in trainer.state.params.items():
        assert not np.array_equal(value, before[name]), f"{name} never moved"


@pytest.mark.parametrize("field", ["rewards", "obs", "behavior_log_probs", "aux_targets"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_skips_the_whole_step(field: str, bad: float, data_seed: int) -> None:
    trainer = make_trainer()
    rng = np.random.default_rng(data_seed)
    run(trainer, data_seed + 1, 5)
    rollout = random_rollout(rng)
    getattr(rollout, field).reshape(-1)[3] = bad
    before = {k: v.copy() for k, v in trainer.state_dict().items()}
    digest = trainer.param_digest()
    result = trainer.step(rollout)
    assert result.skipped and field in result.skip_reason
    assert trainer.param_digest() == digest
    for name, array in trainer.state_dict().items():
        assert array.tobytes() == before[name].tobytes(), name


def test_non_finite_gradient_skips_the_update_untouched(data_seed: int) -> None:
    # Huge rewards overflow the float32 value loss: the guard must leave parameters alone.
    trainer = make_trainer()
    rng = np.random.default_rng(data_seed)
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
def test_bad_rollout_is_rejected_without_change(field, mutate, message, data_seed) -> None:
    trainer = make_trainer()
    rng = np.random.default_rng(data_seed)
    rollout = random_rollout(rng)
    while not rollout.truncated.any():
        rollout = random_rollout(rng)
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


def test_act_modes(data_seed: int) -> None:
    trainer = make_trainer()
    run(trainer, data_seed, 4)
    obs = np.random.default_rng(data_seed).standard_normal((257, 6)).astype(np.float32)
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


def test_act_sampling_follows_the_policy_and_is_reproducible(data_seed: int) -> None:
    first, second = make_trainer(), make_trainer()
    context = np.random.default_rng(data_seed).standard_normal((1, 6)).astype(np.float32)
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
    trainer = make_trainer()
    with pytest.raises(InvalidInput) as caught:
        trainer.act(*args)
    assert caught.value.field == field
    assert int(trainer.state.counters["act_calls"][0]) == 0


def test_update_hyperparams(data_seed: int) -> None:
    trainer = make_trainer()
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


def test_policy_lag_is_reported(data_seed: int) -> None:
    trainer = make_trainer()
    run(trainer, data_seed, 3)
    rollout = random_rollout(np.random.default_rng(data_seed))
    result = trainer.step(Rollout(**{**rollout.__dict__, "policy_version": 1}))
    assert result.policy_lag == 2 and result.global_step == 4
