"""gae against a slow per-env reverse loop of the formulas, and closed forms at the edges.

δ_t = r_t + γ V(s_{t+1}) (1 - term_t) - V(s_t)
Â_t = δ_t + γ λ (1 - done_t) Â_{t+1},  done_t = term_t or trunc_t,  R_t = Â_t + V(s_t)

Inputs are fresh random draws each run; the seed is printed (shown on failure) and can be
pinned with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.backend import numpy_ops as ops

T, N = 11, 7
GAMMA_LAMBDA = [
    (0.99, 0.95),
    (0.0, 0.95),
    (0.99, 0.0),
    (1.0, 1.0),
    (0.0, 0.0),
    (1.0, 0.0),
    (0.0, 1.0),
    (0.97, 1.0),
    (1.0, 0.9),
]


def slow_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    steps, envs = values.shape
    adv = np.zeros((steps, envs))
    for n in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            term, trunc = bool(terminated[t, n]), bool(truncated[t, n])
            bootstrap = 0.0 if term else gamma * float(next_values[t, n])
            delta = float(rewards[t, n]) + bootstrap - float(values[t, n])
            carry = 0.0 if (term or trunc) else gamma * lam * running
            running = delta + carry
            adv[t, n] = running
    return adv, adv + values


def rollout(
    rng: np.random.Generator, p_term: float, p_trunc: float, steps: int = T, envs: int = N
) -> dict[str, np.ndarray]:
    values = rng.normal(size=(steps + 1, envs))
    next_values = values[1:].copy()
    terminated = rng.random((steps, envs)) < p_term
    truncated = rng.random((steps, envs)) < p_trunc
    # A truncated step bootstraps from V(final obs), not from the next episode's first state.
    final = rng.normal(size=(steps, envs))
    next_values = np.where(truncated, final, next_values)
    return {
        "rewards": rng.normal(size=(steps, envs)),
        "values": values[:-1].copy(),
        "next_values": next_values,
        "terminated": terminated,
        "truncated": truncated,
    }


def run_gae(ro: dict[str, np.ndarray], gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    return ops.gae(
        ro["rewards"],
        ro["values"],
        ro["next_values"],
        ro["terminated"],
        ro["truncated"],
        gamma,
        lam,
    )


def check_against_slow(ro: dict[str, np.ndarray], gamma: float, lam: float) -> None:
    adv, ret = run_gae(ro, gamma, lam)
    want_adv, want_ret = slow_gae(**ro, gamma=gamma, lam=lam)
    assert adv.shape == ret.shape == ro["values"].shape
    np.testing.assert_allclose(adv, want_adv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAMBDA)
@pytest.mark.parametrize(
    ("p_term", "p_trunc"), [(0.0, 0.0), (0.2, 0.0), (0.0, 0.2), (0.2, 0.2)], ids=str
)
def test_matches_slow_loop(
    rng: np.random.Generator, gamma: float, lam: float, p_term: float, p_trunc: float
) -> None:
    check_against_slow(rollout(rng, p_term, p_trunc), gamma, lam)


@pytest.mark.parametrize(("steps", "envs"), [(1, 1), (1, 7), (13, 1)])
def test_odd_shapes(rng: np.random.Generator, steps: int, envs: int) -> None:
    check_against_slow(rollout(rng, 0.2, 0.2, steps, envs), 0.99, 0.95)


def test_terminated_only_ignores_next_values(rng: np.random.Generator) -> None:
    ro = rollout(rng, 0.3, 0.0)
    ro["terminated"][T // 2, :] = True  # at least one per env
    check_against_slow(ro, 0.99, 0.95)
    adv, _ = run_gae(ro, 0.99, 0.95)
    perturbed = dict(ro, next_values=np.where(ro["terminated"], 1e3, ro["next_values"]))
    adv2, _ = run_gae(perturbed, 0.99, 0.95)
    np.testing.assert_array_equal(adv2, adv)
    # The episode ends at the terminated step: Â_t = r_t - V(s_t) there.
    term = ro["terminated"]
    np.testing.assert_allclose(adv[term], (ro["rewards"] - ro["values"])[term], atol=1e-12)


def test_truncated_only_bootstraps_from_final_value(rng: np.random.Generator) -> None:
    gamma, lam = 0.97, 0.9
    ro = rollout(rng, 0.0, 0.0)
    t_cut, n = 6, int(rng.integers(N))
    ro["truncated"][t_cut, n] = True
    check_against_slow(ro, gamma, lam)
    adv, _ = run_gae(ro, gamma, lam)
    # At the truncated step the recursion is cut but V(final obs) is used.
    want = ro["rewards"][t_cut, n] + gamma * ro["next_values"][t_cut, n] - ro["values"][t_cut, n]
    np.testing.assert_allclose(adv[t_cut, n], want, rtol=1e-12, atol=1e-12)
    # Changing V(final obs) by Δ moves Â_t' by (γλ)^(t_cut - t') γ Δ for t' <= t_cut only.
    shift = 0.75
    next_values = ro["next_values"].copy()
    next_values[t_cut, n] += shift
    adv2, _ = run_gae(dict(ro, next_values=next_values), gamma, lam)
    expected = np.zeros((T, N))
    for t in range(t_cut + 1):
        expected[t, n] = (gamma * lam) ** (t_cut - t) * gamma * shift
    np.testing.assert_allclose(adv2 - adv, expected, rtol=0, atol=1e-12)


def test_both_flags_act_as_termination(rng: np.random.Generator) -> None:
    ro = rollout(rng, 0.15, 0.15)
    both = rng.random((T, N)) < 0.2
    ro["terminated"] |= both
    ro["truncated"] |= both
    check_against_slow(ro, 0.99, 0.95)
    only_term = dict(ro, truncated=ro["truncated"] & ~ro["terminated"])
    np.testing.assert_allclose(run_gae(ro, 0.99, 0.95)[0], run_gae(only_term, 0.99, 0.95)[0])


def test_closed_forms_without_dones(rng: np.random.Generator) -> None:
    ro = rollout(rng, 0.0, 0.0)
    r, v, nv = ro["rewards"], ro["values"], ro["next_values"]
    gamma = 0.93
    # λ = 0: one-step TD error.
    adv, ret = run_gae(ro, gamma, 0.0)
    np.testing.assert_allclose(adv, r + gamma * nv - v, atol=1e-12)
    np.testing.assert_allclose(ret, r + gamma * nv, atol=1e-12)
    # γ = 0: Â = r - V.
    adv, _ = run_gae(ro, 0.0, 0.95)
    np.testing.assert_allclose(adv, r - v, atol=1e-12)
    # λ = 1 (next_values chain through values): discounted Monte-Carlo return minus V.
    adv, ret = run_gae(ro, gamma, 1.0)
    for t in range(T):
        mc = sum(gamma ** (s - t) * r[s] for s in range(t, T)) + gamma ** (T - t) * nv[-1]
        np.testing.assert_allclose(ret[t], mc, atol=1e-12)
        np.testing.assert_allclose(adv[t], mc - v[t], atol=1e-12)


def test_float32_stays_float32(rng: np.random.Generator) -> None:
    ro = rollout(rng, 0.2, 0.2)
    ro32 = {k: (a.astype(np.float32) if a.dtype == np.float64 else a) for k, a in ro.items()}
    adv, ret = run_gae(ro32, 0.99, 0.95)
    assert adv.dtype == np.float32 and ret.dtype == np.float32
    want_adv, want_ret = slow_gae(**ro32, gamma=0.99, lam=0.95)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
