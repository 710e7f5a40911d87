"""categorical_projection against a slow triple loop of Dopamine's closed form, plus edge cases.

m_i = Σ_j clip(1 - |clip(Tz_j, v_min, v_max) - z_i| / Δz, 0, 1) p_j,
Tz_j = r + γ^k (1 - done) z_j.

Inputs are fresh random draws each run; the seed is printed (shown on failure) and can be
pinned with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.backend import numpy_ops as ops

Z = 51


def slow_projection(
    p: np.ndarray,
    r: np.ndarray,
    done: np.ndarray,
    k: np.ndarray,
    gamma: float,
    v_min: float,
    v_max: float,
) -> np.ndarray:
    """Dopamine's closed form as a plain-Python triple loop in float64."""
    batch, atoms = p.shape
    dz = (v_max - v_min) / (atoms - 1)
    z = [v_min + i * dz for i in range(atoms)]
    out = np.zeros((batch, atoms))
    for b in range(batch):
        discount = float(gamma) ** int(k[b]) * (1.0 - float(done[b]))
        tz = [min(max(float(r[b]) + discount * z[j], v_min), v_max) for j in range(atoms)]
        for i in range(atoms):
            total = 0.0
            for j in range(atoms):
                weight = min(max(1.0 - abs(tz[j] - z[i]) / dz, 0.0), 1.0)
                total += weight * float(p[b, j])
            out[b, i] = total
    return out


def random_probs(rng: np.random.Generator, batch: int, atoms: int = Z) -> np.ndarray:
    p = rng.random((batch, atoms)) ** 2
    return p / p.sum(-1, keepdims=True)


def project(
    p: np.ndarray,
    r: object,
    done: object,
    k: object,
    gamma: float,
    v_min: float,
    v_max: float,
) -> np.ndarray:
    return ops.categorical_projection(
        p,
        np.asarray(r, dtype=p.dtype),
        np.asarray(done, dtype=np.uint8),
        np.asarray(k, dtype=np.int32),
        gamma,
        v_min,
        v_max,
    )


@pytest.mark.parametrize("B", [1, 7])
@pytest.mark.parametrize(
    ("gamma", "v_min", "v_max"), [(0.99, -10.0, 10.0), (0.9, -3.7, 5.2), (0.5, 0.0, 1.0)]
)
def test_matches_slow_closed_form(
    rng: np.random.Generator, B: int, gamma: float, v_min: float, v_max: float
) -> None:
    p = random_probs(rng, B)
    span = v_max - v_min
    r = rng.uniform(v_min - 0.3 * span, v_max + 0.3 * span, size=B)  # some beyond the support
    done = rng.integers(0, 2, size=B)
    k = rng.integers(1, 6, size=B)
    got = project(p, r, done, k, gamma, v_min, v_max)
    assert got.dtype == np.float64 and got.shape == (B, Z)
    want = slow_projection(p, r, done, k, gamma, v_min, v_max)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert np.all(got >= 0)


def test_mass_is_conserved(rng: np.random.Generator) -> None:
    B = 61
    p = random_probs(rng, B)
    r = rng.normal(scale=8.0, size=B)
    got = project(p, r, rng.integers(0, 2, size=B), rng.integers(1, 4, size=B), 0.97, -10, 10)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("v_min", "v_max"), [(-10.0, 10.0), (-3.7, 5.2)])
def test_identity_when_r0_gamma1_not_done(
    rng: np.random.Generator, v_min: float, v_max: float
) -> None:
    B = 7
    p = random_probs(rng, B)
    got = project(p, np.zeros(B), np.zeros(B), np.ones(B), 1.0, v_min, v_max)
    np.testing.assert_allclose(got, p, rtol=0, atol=1e-12)


def test_identity_is_exact_on_a_dyadic_support(rng: np.random.Generator) -> None:
    """With Δz = 0.5 every Tz_j lands exactly on atom j: the whole mass stays there."""
    B, atoms = 7, 41
    p = random_probs(rng, B, atoms)
    got = project(p, np.zeros(B), np.zeros(B), rng.integers(1, 4, size=B), 1.0, -10.0, 10.0)
    np.testing.assert_array_equal(got, p)


@pytest.mark.parametrize("shift", [1, 3, -2, 40])
def test_reward_of_k_atoms_shifts_and_piles_up(rng: np.random.Generator, shift: int) -> None:
    B, atoms, v_min, v_max = 7, 41, -10.0, 10.0  # Δz = 0.5, exact
    dz = (v_max - v_min) / (atoms - 1)
    p = random_probs(rng, B, atoms)
    got = project(p, np.full(B, shift * dz), np.zeros(B), np.ones(B), 1.0, v_min, v_max)
    want = np.zeros_like(p)
    for b in range(B):
        for j in range(atoms):
            want[b, min(max(j + shift, 0), atoms - 1)] += p[b, j]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(
        got,
        slow_projection(p, np.full(B, shift * dz), np.zeros(B), np.ones(B), 1.0, v_min, v_max),
        atol=1e-15,
    )


@pytest.mark.parametrize("done", [0, 1])
def test_rewards_beyond_the_support(rng: np.random.Generator, done: int) -> None:
    B = 7
    p = random_probs(rng, B)
    for r, end in ((rng.uniform(30.0, 1e6), Z - 1), (-rng.uniform(30.0, 1e6), 0)):
        got = project(p, np.full(B, r), np.full(B, done), np.ones(B), 0.99, -10.0, 10.0)
        want = np.zeros_like(p)
        want[:, end] = 1.0
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("v_min", "v_max"), [(-10.0, 10.0), (-3.7, 5.2)])
def test_done_puts_mass_around_r_only(rng: np.random.Generator, v_min: float, v_max: float) -> None:
    B = 7
    dz = (v_max - v_min) / (Z - 1)
    r = rng.uniform(v_min, v_max, size=B)
    p1, p2 = random_probs(rng, B), random_probs(rng, B)
    k = rng.integers(1, 5, size=B)
    got1 = project(p1, r, np.ones(B), k, 0.99, v_min, v_max)
    got2 = project(p2, r, np.ones(B), k, 0.99, v_min, v_max)
    np.testing.assert_allclose(got1, got2, rtol=0, atol=1e-12)  # regardless of p
    want = np.zeros((B, Z))
    for b in range(B):
        pos = (r[b] - v_min) / dz
        lower = int(np.floor(pos))
        want[b, lower] += 1.0 - (pos - lower)
        if lower + 1 < Z:
            want[b, lower + 1] += pos - lower
    np.testing.assert_allclose(got1, want, rtol=0, atol=1e-12)


def test_gamma_zero_equals_done(rng: np.random.Generator) -> None:
    B = 7
    r = rng.uniform(-12.0, 12.0, size=B)
    p = random_probs(rng, B)
    k = rng.integers(1, 5, size=B)
    got = project(p, r, np.zeros(B), k, 0.0, -10.0, 10.0)
    np.testing.assert_allclose(
        got, project(random_probs(rng, B), r, np.ones(B), k, 0.99, -10.0, 10.0), atol=1e-12
    )
    np.testing.assert_allclose(got, slow_projection(p, r, np.zeros(B), k, 0.0, -10, 10), atol=1e-12)


def test_gamma_one(rng: np.random.Generator) -> None:
    B = 7
    p = random_probs(rng, B)
    r = rng.uniform(-3.0, 3.0, size=B)
    k = rng.integers(1, 5, size=B)
    got = project(p, r, np.zeros(B), k, 1.0, -10.0, 10.0)
    want = slow_projection(p, r, np.zeros(B), k, 1.0, -10.0, 10.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # γ = 1 makes the horizon irrelevant.
    np.testing.assert_allclose(
        got, project(p, r, np.zeros(B), np.ones(B), 1.0, -10, 10), atol=1e-12
    )


def test_per_sample_horizons(rng: np.random.Generator) -> None:
    """Sample b uses γ^k_b: equal to a one-step projection with discount γ^k_b."""
    B, gamma = 7, 0.9
    p = random_probs(rng, B)
    r = rng.uniform(-4.0, 4.0, size=B)
    k = np.array([1, 2, 3, 5, 8, 2, 4])[rng.permutation(B)]
    got = project(p, r, np.zeros(B), k, gamma, -10.0, 10.0)
    np.testing.assert_allclose(
        got, slow_projection(p, r, np.zeros(B), k, gamma, -10, 10), atol=1e-12
    )
    for b in range(B):
        one_step = project(p[b : b + 1], r[b : b + 1], [0], [1], gamma ** int(k[b]), -10.0, 10.0)
        np.testing.assert_allclose(got[b : b + 1], one_step, rtol=0, atol=1e-12)
    # Different horizons give different targets.
    assert not np.allclose(got[0], project(p[:1], r[:1], [0], [int(k[0]) + 1], gamma, -10, 10))


def test_float32_stays_float32(rng: np.random.Generator) -> None:
    B = 7
    p64 = random_probs(rng, B)
    r = rng.uniform(-12.0, 12.0, size=B)
    done = rng.integers(0, 2, size=B)
    k = rng.integers(1, 4, size=B)
    got = project(p64.astype(np.float32), r, done, k, 0.99, -10.0, 10.0)
    assert got.dtype == np.float32 and got.shape == (B, Z)
    want = slow_projection(p64.astype(np.float32), r.astype(np.float32), done, k, 0.99, -10, 10)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=0, atol=1e-5)
