"""Value normalisation and the C51 support warning: the statistics against a float64 rewrite of
their formula, what Act and the value loss see, and the advice a badly fitting support gets."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_rollout, small_config

from service.config import C51Config
from service.trainer.support_watch import COOLDOWN, THRESHOLD, WINDOW, SupportWatch
from service.trainer.trainer import Trainer
from service.trainer.value_norm import VARIANCE_FLOOR, ValueNorm, moments
from service.types import ActMode


def reference_moments(batches: list[np.ndarray], beta: float) -> tuple[float, float]:
    """μ, σ of MAPPO's debiased moving averages, written out in float64."""
    a = b = c = 0.0
    for batch in batches:
        x = batch.astype(np.float64).ravel()
        a = beta * a + (1 - beta) * x.mean()
        b = beta * b + (1 - beta) * (x * x).mean()
        c = beta * c + (1 - beta)
    mean = a / c
    return mean, float(np.sqrt(max(b / c - mean * mean, VARIANCE_FLOOR)))


def test_statistics_follow_the_debiased_moving_averages(rng: np.random.Generator) -> None:
    beta = float(rng.uniform(0.5, 0.99))
    norm = ValueNorm(np, np.dtype(np.float32), beta, enabled=True)
    assert moments(norm.stats) == (0.0, 1.0)  # before any Step: the identity
    batches = [rng.normal(rng.uniform(-50, 50), rng.uniform(0.5, 30), (4, 7)) for _ in range(6)]
    ok, bad = np.array([True]), np.array([False])
    for i, batch in enumerate(batches):
        before = norm.stats.copy()
        proposed = norm.updated(batch.astype(np.float32))
        np.testing.assert_array_equal(norm.stats, before)  # a proposal until committed
        norm.commit(norm.updated(np.full((4, 7), np.nan, np.float32)), bad)  # nothing applied
        np.testing.assert_array_equal(norm.stats, before)
        norm.commit(proposed, ok)
        mean, std = reference_moments([b.astype(np.float32) for b in batches[: i + 1]], beta)
        np.testing.assert_allclose(moments(norm.stats), (mean, std), rtol=1e-12)
    values = rng.normal(0, 40, 33).astype(np.float32)
    normalised = norm.normalize(values)
    assert normalised.dtype == np.float32
    np.testing.assert_allclose(normalised, (values - mean) / std, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.denormalize(normalised), values, rtol=1e-5, atol=1e-4)


def test_a_constant_return_is_floored_not_divided_by_zero(rng: np.random.Generator) -> None:
    norm = ValueNorm(np, np.dtype(np.float64), 0.9, enabled=True)
    constant = float(rng.normal())
    for _ in range(3):
        norm.commit(norm.updated(np.full(50, constant)), np.array([True]))
    mean, std = moments(norm.stats)
    assert mean == pytest.approx(constant) and std == pytest.approx(np.sqrt(VARIANCE_FLOOR))


def test_disabled_is_the_identity(rng: np.random.Generator) -> None:
    norm = ValueNorm(np, np.dtype(np.float32), 0.9, enabled=False)
    returns = rng.normal(10, 5, 20).astype(np.float32)
    norm.commit(norm.updated(returns), np.array([True]))
    assert norm.normalize(returns) is returns and norm.denormalize(returns) is returns
    assert not norm.stats.any()


def test_act_reports_the_denormalised_value(rng: np.random.Generator) -> None:
    """V(s) from Act is σ v̂ + μ, with v̂ the value head's output, computed here from the saved
    parameters and statistics."""
    trainer = Trainer(small_config("ppo.value_norm=true"))
    for _ in range(3):  # rewards of mean 10 and spread 30: returns whose statistics must move
        rollout = random_rollout(rng)
        rewards = rollout.rewards * 30 + 10
        trainer.step(rollout.__class__(**{**rollout.__dict__, "rewards": rewards}))
    state = trainer.state_dict()
    a, b, c = state["params/v/norm"]
    mean = a / c
    std = np.sqrt(max(b / c - mean * mean, VARIANCE_FLOOR))
    assert abs(mean) > 0.1 and std > 1.5  # the statistics moved away from the identity
    obs = rng.normal(size=(11, 6)).astype(np.float32)
    h = obs.astype(np.float64)
    for layer in range(trainer.config.model.depth):
        W, bias = state[f"params/encoder/W{layer}"], state[f"params/encoder/b{layer}"]
        h = np.maximum(h @ W + bias, 0.0)
    v_hat = (h @ state["params/v/W"] + state["params/v/b"])[:, 0]
    for mode in ActMode:
        np.testing.assert_allclose(trainer.act(obs, mode).values, std * v_hat + mean, rtol=1e-4)


@pytest.mark.parametrize("value_norm", [True, False])
def test_value_loss_scale_with_large_rewards(rng: np.random.Generator, value_norm: bool) -> None:
    """With value normalisation the value loss stays O(1) when rewards are 1,000 times larger;
    without it, it grows with the square of the reward scale."""
    overrides = [f"ppo.value_norm={value_norm}", "ppo.value_norm_decay=0.5"]
    losses = []
    for scale in (1.0, 1000.0):
        trainer = Trainer(small_config(*overrides))
        data = np.random.default_rng(int(rng.integers(2**31)))
        for _ in range(4):
            rollout = random_rollout(data)
            scaled = rollout.rewards * np.float32(scale)
            result = trainer.step(rollout.__class__(**{**rollout.__dict__, "rewards": scaled}))
        losses.append(result.losses["v"])
    if value_norm:
        assert losses[1] < 5.0, losses
    else:
        assert losses[1] > 1e4 * losses[0], losses


def test_support_watch_names_the_settings_and_suggests_a_range(rng: np.random.Generator) -> None:
    watch = SupportWatch(C51Config(v_min=-10.0, v_max=10.0))
    mu, sigma = float(rng.uniform(-60, -20)), float(rng.uniform(5, 20))
    asked = []

    def returns() -> tuple[float, float]:
        asked.append(True)
        return mu, sigma

    step = 0
    for step in range(1, WINDOW):  # a full window is needed
        assert watch.observe(step, 0.5, returns) is None
    message = watch.observe(WINDOW, 0.5, returns)
    assert message is not None and len(asked) == 1
    assert "c51.v_min" in message and "c51.v_max" in message and "[-10, 10]" in message
    assert f"c51.v_min={int(np.floor(mu - 4 * sigma))}" in message
    assert f"c51.v_max={int(np.ceil(mu + 4 * sigma))}" in message
    for step in range(WINDOW + 1, WINDOW + COOLDOWN):  # then quiet for a while
        assert watch.observe(step, 0.5, returns) is None
    assert watch.observe(WINDOW + COOLDOWN, 0.5, None) is not None
    calm = SupportWatch(C51Config())
    assert all(calm.observe(s, THRESHOLD * 0.9, returns) is None for s in range(3 * WINDOW))


def test_the_trainer_warns_when_returns_overflow_the_support(rng: np.random.Generator) -> None:
    overrides = ["c51.v_min=-1", "c51.v_max=1", "replay.min_size=6", "ppo.value_norm=true"]
    trainer = Trainer(small_config(*overrides))
    warnings = []
    for _ in range(WINDOW + 2):
        rollout = random_rollout(rng)
        big = rollout.rewards * np.float32(50.0)
        warnings += trainer.step(rollout.__class__(**{**rollout.__dict__, "rewards": big})).warnings
    assert len(warnings) == 1 and "c51.v_min" in warnings[0], warnings
