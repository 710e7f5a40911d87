"""The head CUDA kernels (through CudaOps) against their NumPy twins, Trainer.act, ReplayBuffer.

Error measure: max |gpu - numpy| / scale per tensor, below 1e-5, where scale is max |numpy|, or
for a batch mean the mean of |row terms| (a bound that cancellation cannot shrink to zero).
Exact where the kernels promise it: actions and replay slots and rows (integers and copies),
the C51 projection where γ^k is exact (k = 1, γ in {0, 1}), the ε coin for any ε. Inputs whose
answer jumps at a float32 boundary (a PPO ratio at 1 ± ε, |v - v_old| at the value clip ε) are
kept away from it; a sampled action may differ, by one, only on rows whose inverse-CDF
threshold lies within 1e-5 of a cdf entry (an ulp of exp apart on two implementations).

Batch sizes avoid multiples of the block size; two dims sets, A·Z = 459 (> one block) and a
small one. Random inputs are fresh each run; the seed is printed and can be pinned with
TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="no CUDA device visible to CuPy (cupy is not installed)")

from service.backend import numpy_ops as npo  # noqa: E402
from service.backend.cuda.act import ACT_MODES  # noqa: E402
from service.backend.cuda.loader import CudaDims  # noqa: E402
from service.backend.cuda.ops import CudaOps  # noqa: E402
from service.backend.cuda.replay import REPLAY_FIELDS  # noqa: E402
from service.backend.philox import Stream, below, random_bits, seed_key, uniform01  # noqa: E402
from service.config import load_config  # noqa: E402
from service.trainer import model  # noqa: E402
from service.trainer.replay import ReplayBuffer  # noqa: E402
from service.trainer.trainer import Trainer  # noqa: E402
from service.types import ActMode, Transitions  # noqa: E402

from .conftest import assert_close, dev, host, normal, same_bytes  # noqa: E402

SIZES = (1, 7, 255, 1000, 4099)
DIMS = (
    CudaDims(D=12, H=256, A=9, Z=51, K=3),  # the defaults: A·Z = 459 columns, more than a block
    CudaDims(D=5, H=37, A=5, Z=21, K=2),
)
V_MIN, V_MAX = -10.0, 10.0


# --------------------------------------------------------------------------- helpers
# normal, dev, host, assert_close, same_bytes, TOL: tests/gpu/conftest.py; rng: tests/conftest.py
@pytest.fixture(scope="module", params=DIMS, ids=lambda d: f"A{d.A}Z{d.Z}H{d.H}")
def ops(request: pytest.FixtureRequest) -> CudaOps:
    return CudaOps(request.param)


def assert_mean_close(got: cupy.ndarray, want: np.ndarray, terms: np.ndarray) -> None:
    """A batch mean: scale = max(|want|, mean |terms|)."""
    scale = max(float(np.abs(want)), float(np.mean(np.abs(terms.astype(np.float64)))))
    assert_close(got, want, scale=scale)


def assert_exact(got: cupy.ndarray, want: np.ndarray) -> None:
    got_h, want = host(got), np.asarray(want)
    assert got_h.dtype == want.dtype, (got_h.dtype, want.dtype)
    np.testing.assert_array_equal(got_h, want)


def distributions(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Random probability vectors over the last axis (float32, each summing to ~1)."""
    return npo.c51_softmax(normal(rng, *shape, scale=2.0))


def projection_inputs(ops: CudaOps, rng: np.random.Generator, B: int) -> tuple[np.ndarray, ...]:
    p = distributions(rng, B, ops.dims.Z)
    r = normal(rng, B, scale=4.0)  # some Tz beyond the ends of [-10, 10]
    done = (rng.random(B) < 0.2).astype(np.uint8)
    k = rng.integers(1, 6, B).astype(np.int32)
    return p, r, done, k


# --------------------------------------------------------------------------- C51 head
def test_c51_support(ops: CudaOps) -> None:
    Z = ops.dims.Z
    assert_exact(
        ops.c51_support(V_MIN, V_MAX, Z, np.float32),
        npo.c51_support(V_MIN, V_MAX, Z, np.dtype(np.float32)),
    )


@pytest.mark.parametrize("B", SIZES)
def test_c51_softmax_and_q_values(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    A, Z = ops.dims.A, ops.dims.Z
    logits = normal(rng, B, A, Z, scale=3.0)
    logits[0, 0, :] = 7.0  # a uniform row: ties for the max
    probs = ops.c51_softmax(dev(logits))
    assert_close(probs, npo.c51_softmax(logits))
    support = npo.c51_support(V_MIN, V_MAX, Z, np.dtype(np.float32))
    p = npo.c51_softmax(logits)
    assert_close(ops.c51_q_values(dev(p), dev(support)), npo.c51_q_values(p, support), scale=V_MAX)


@pytest.mark.parametrize("B", SIZES)
def test_c51_greedy(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    A, Z = ops.dims.A, ops.dims.Z
    logits = normal(rng, B, A, Z, scale=3.0)
    logits[0, 2] = logits[0, 1]  # a tie for the best: the first wins
    logits[0, 1:3, -1] += 50.0
    if B > 1:
        logits[B - 1, A - 1, 0] = np.nan  # np.argmax picks the first NaN
    bias = normal(rng, A * Z, scale=0.5)
    bias[2 * Z : 3 * Z] = bias[Z : 2 * Z]  # the tie survives the bias
    support = npo.c51_support(V_MIN, V_MAX, Z, np.dtype(np.float32))
    best, probs = ops.c51_greedy(dev(logits), dev(bias), dev(support))
    want_best, want_probs = npo.c51_greedy(logits, bias, support)
    got_best, got_probs = host(best), host(probs)
    assert got_best[0] == 1 and (B == 1 or got_best[B - 1] == A - 1)
    if B > 1:
        assert np.isnan(got_probs[B - 1]).all()
    # q sums in another order than the twin's float32 dot: rows whose top two actions are
    # within rounding of each other may pick either; they must be rare, the rest agree.
    q = np.sort(npo.c51_q_values(npo.c51_softmax(logits), support), axis=1)
    clear = q[:, -1] - q[:, -2] > 1e-5 * V_MAX
    clear[[0, B - 1]] = True  # the tie row and the NaN row (decided above)
    assert (~clear).sum() <= max(1, B // 200)
    np.testing.assert_array_equal(got_best[clear], want_best[clear])
    finite = clear & np.isfinite(want_probs).all(axis=1)
    assert_close(probs[dev(np.flatnonzero(finite))], want_probs[finite])


def taken_inputs(ops: CudaOps, rng: np.random.Generator, B: int) -> tuple[np.ndarray, ...]:
    H, A, Z = ops.dims.H, ops.dims.A, ops.dims.Z
    h = np.maximum(normal(rng, B, H), 0)
    W, b = normal(rng, H, A * Z, scale=0.1), normal(rng, A * Z, scale=0.5)
    return h, W, b, distributions(rng, B, Z)


@pytest.mark.parametrize("actions_drawn", ["uniform", "skewed"])
@pytest.mark.parametrize("B", SIZES)
def test_c51_taken_loss_bwd(
    ops: CudaOps, rng: np.random.Generator, B: int, actions_drawn: str
) -> None:
    A, Z = ops.dims.A, ops.dims.Z
    h, W, b, target = taken_inputs(ops, rng, B)
    if actions_drawn == "uniform":
        actions = rng.integers(0, A, B).astype(np.int32)
        if B > A:
            actions[actions == A - 1] = 0  # one action never taken: its columns must be zero
    else:  # nearly every row on one action: many tiles and chunks of one segment
        actions = np.where(rng.random(B) < 0.97, 2, rng.integers(0, A, B)).astype(np.int32)
    got = ops.c51_taken_loss_bwd(dev(h), dev(W), dev(b), dev(actions), dev(target))
    want = npo.c51_taken_loss_bwd(h, W, b, actions, target)
    assert got[0].shape == ()
    assert_close(got[0], np.float32(want[0]))
    for g, w in zip(got[1:], want[1:], strict=True):
        assert_close(g, w)
    # The weight gradients from the twin's grad_taken: this op checked alone.
    grad_W, grad_b = ops.c51_taken_grad_params(dev(h), dev(actions), dev(want[2]), A)
    want_W, want_b = npo.c51_taken_grad_params(h, actions, want[2], A)
    assert_close(grad_W, want_W)
    assert_close(grad_b, want_b)
    if actions_drawn == "uniform" and B > A:
        assert np.all(host(grad_W)[:, (A - 1) * Z :] == 0)
        assert np.all(host(grad_b)[(A - 1) * Z :] == 0)


def test_c51_taken_bad_action_is_nan_without_gradient(
    ops: CudaOps, rng: np.random.Generator
) -> None:
    """An action outside [0, A) gives a NaN loss (the guard skips the update), a zero grad_h
    row, and no weight column sees the row."""
    A, B = ops.dims.A, 40
    h, W, b, target = taken_inputs(ops, rng, B)
    actions = rng.integers(0, A, B).astype(np.int32)
    actions[[3, 17]] = [A, -1]
    loss, grad_h, grad_taken = ops.c51_taken_loss_bwd(
        dev(h), dev(W), dev(b), dev(actions), dev(target)
    )
    grad_W, grad_b = ops.c51_taken_grad_params(dev(h), dev(actions), grad_taken, A)
    want = npo.c51_taken_loss_bwd(h, W, b, actions, target)
    want_W, want_b = npo.c51_taken_grad_params(h, actions, want[2], A)
    assert np.isnan(host(loss)) and np.isnan(want[0])
    assert np.all(host(grad_h)[[3, 17]] == 0) and np.all(host(grad_taken)[[3, 17]] == 0)
    assert_close(grad_h, want[1])
    assert_close(grad_taken, want[2])
    assert_close(grad_W, want_W)
    assert_close(grad_b, want_b)


# --------------------------------------------------------------------------- projection
@pytest.mark.parametrize("B", SIZES)
def test_categorical_projection(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    p, r, done, k = projection_inputs(ops, rng, B)
    args = (p, r, done, k)
    got = ops.categorical_projection(*map(dev, args), 0.99, V_MIN, V_MAX)
    assert_close(got, npo.categorical_projection(*args, 0.99, V_MIN, V_MAX))
    ratio = ops.c51_support_clip_ratio(*map(dev, args), 0.99, V_MIN, V_MAX)
    want = npo.c51_support_clip_ratio(*args, 0.99, V_MIN, V_MAX)
    assert_close(ratio, np.float32(want), scale=max(float(want), 1.0 / B))


@pytest.mark.parametrize("B", (1, 255, 4099))
def test_categorical_projection_bit_exact_when_gamma_power_is(
    ops: CudaOps, rng: np.random.Generator, B: int
) -> None:
    """k = 1: γ^k = γ on both sides, and every other operation is the twin's: equal bits."""
    p, r, done, _ = projection_inputs(ops, rng, B)
    k = np.ones(B, dtype=np.int32)
    gamma = float(rng.uniform(0.5, 1.0))
    got = ops.categorical_projection(dev(p), dev(r), dev(done), dev(k), gamma, -7.3, 11.1)
    assert_exact(got, npo.categorical_projection(p, r, done, k, gamma, -7.3, 11.1))


@pytest.mark.parametrize(
    ("case", "gamma"),
    [
        ("on_atoms", 1.0),
        ("shift_on_atoms", 1.0),
        ("beyond_top", 0.99),
        ("beyond_bottom", 0.99),
        ("done", 0.99),
        ("gamma_zero", 0.0),
        ("gamma_one_long", 1.0),
    ],
)
def test_categorical_projection_edges(
    ops: CudaOps, rng: np.random.Generator, case: str, gamma: float
) -> None:
    """Tz on an atom (all mass to it), beyond both ends, done = 1, γ = 0, γ = 1: the twin's bits."""
    B, Z = 33, ops.dims.Z
    v_min, v_max = -float(Z - 1), float(Z - 1)  # Δz = 2, exact: shifts by whole atoms are exact
    p = distributions(rng, B, Z)
    r = np.zeros(B, dtype=np.float32)
    done = np.zeros(B, dtype=np.uint8)
    k = np.ones(B, dtype=np.int32)
    if case == "shift_on_atoms":
        r = (2.0 * rng.integers(-3, 4, B)).astype(np.float32)  # Tz_j = z_j + whole atoms
    elif case == "beyond_top":
        r[:] = 10.0 * Z
    elif case == "beyond_bottom":
        r[:] = -10.0 * Z
    elif case == "done":
        done[:] = 1
        r = normal(rng, B, scale=Z / 2)
    elif case == "gamma_zero":
        r = normal(rng, B, scale=Z / 2)
    elif case == "gamma_one_long":
        k = rng.integers(1, 50, B).astype(np.int32)
    args = (p, r, done, k)
    got = host(ops.categorical_projection(*map(dev, args), gamma, v_min, v_max))
    want = npo.categorical_projection(*args, gamma, v_min, v_max)
    np.testing.assert_array_equal(got, want)
    if case == "on_atoms":
        np.testing.assert_array_equal(got, p)
    if case == "beyond_top":
        np.testing.assert_allclose(got[:, -1], p.sum(axis=1), rtol=1e-6)
        assert np.all(got[:, :-1] == 0)
    if case == "beyond_bottom":
        np.testing.assert_allclose(got[:, 0], p.sum(axis=1), rtol=1e-6)
        assert np.all(got[:, 1:] == 0)
    ratio = ops.c51_support_clip_ratio(*map(dev, args), gamma, v_min, v_max)
    want_ratio = npo.c51_support_clip_ratio(*args, gamma, v_min, v_max)
    assert_close(ratio, np.float32(want_ratio), scale=max(float(want_ratio), 1.0 / B))


def test_projection_reads_gamma_from_device_memory(ops: CudaOps, rng: np.random.Generator) -> None:
    """γ, v_min, v_max as float64 device scalars: changing the scalar changes the result."""
    p, r, done, k = map(dev, projection_inputs(ops, rng, 255))
    gamma = cupy.asarray(np.array([0.9]))
    hp = cupy.asarray(np.array([V_MIN, V_MAX]))
    first = ops.categorical_projection(p, r, done, k, gamma, hp[0:1], hp[1:2])
    assert same_bytes(first, ops.categorical_projection(p, r, done, k, 0.9, V_MIN, V_MAX))
    gamma[...] = 0.5
    second = ops.categorical_projection(p, r, done, k, gamma, hp[0:1], hp[1:2])
    assert same_bytes(second, ops.categorical_projection(p, r, done, k, 0.5, V_MIN, V_MAX))
    assert not same_bytes(first, second)


# --------------------------------------------------------------------------- PPO head
def ppo_inputs(ops: CudaOps, rng: np.random.Generator, B: int, clip_eps: float):
    A = ops.dims.A
    logits = normal(rng, B, A)
    actions = rng.integers(0, A, B).astype(np.int32)
    log_p = npo.log_softmax(logits)[np.arange(B), actions].astype(np.float64)
    behavior = log_p + 0.4 * rng.standard_normal(B)  # ratios on both sides of the clip
    # Keep every ratio at least 1e-4 away from 1 ± ε, where the gradient switches.
    for edge in (1 - clip_eps, 1 + clip_eps):
        near = np.abs(np.exp(log_p - behavior) - edge) < 1e-4
        behavior[near] += 1e-3
    advantages = normal(rng, B)
    return logits, actions, behavior.astype(np.float32), advantages


@pytest.mark.parametrize("B", SIZES)
def test_log_softmax(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    logits = normal(rng, B, ops.dims.A, scale=3.0)
    assert_close(ops.log_softmax(dev(logits)), npo.log_softmax(logits))
    stacked = normal(rng, 2, B, ops.dims.A)
    assert_close(ops.log_softmax(dev(stacked)), npo.log_softmax(stacked))


@pytest.mark.parametrize("B", SIZES)
def test_ppo_surrogate_fwd_bwd(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    clip_eps, ent_coef = 0.2, 0.01
    logits, actions, behavior, advantages = ppo_inputs(ops, rng, B, clip_eps)
    args = (logits, actions, behavior, advantages)
    stats, grad = ops.ppo_surrogate_fwd_bwd(*map(dev, args), clip_eps, ent_coef)
    want_stats, want_grad = npo.ppo_surrogate_fwd_bwd(*args, clip_eps, ent_coef)
    assert_close(grad, want_grad)
    assert list(stats) == list(want_stats)
    # row terms of each mean, for the scales
    log_p = npo.log_softmax(logits.astype(np.float64))
    ratio = np.exp(log_p[np.arange(B), actions] - behavior)
    pg = -np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.2) * advantages)
    entropy = -np.sum(np.exp(log_p) * log_p, axis=1)
    terms = {
        "loss": np.abs(pg) + ent_coef * entropy,
        "pg_loss": pg,
        "entropy": entropy,
        # (ratio - 1) - log ratio cancels: an ulp of the float32 ratio is an ulp of ~1, so
        # scale by the operands, ratio and |log ratio|
        "approx_kl": ratio + np.abs(np.log(ratio)),
        "clip_fraction": np.ones(B),
    }
    for name, value in stats.items():
        assert value.shape == (), name
        assert_mean_close(value, np.float32(want_stats[name]), terms[name])


@pytest.mark.parametrize("B", SIZES)
def test_kickstart_fwd_bwd(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    """The teacher's cross-entropy against its twin, on a strided feature column (the update
    hands it obs[:, column]), with a silent teacher on one sign and a device weight."""
    logits = normal(rng, B, ops.dims.A, scale=2.0)
    obs = rng.choice(np.array([-1.0, 0.0, 0.5], np.float32), size=(B, 3))
    weight = np.array([0.7])
    for teacher in ((5, 2, 6), (5, -1, 6)):
        loss, grad = ops.kickstart_fwd_bwd(dev(logits), dev(obs)[:, 1], teacher, dev(weight))
        want_loss, want_grad = npo.kickstart_fwd_bwd(logits, obs[:, 1], teacher, 0.7)
        assert_close(grad, want_grad)
        assert loss.shape == ()
        assert_close(loss.reshape(1), np.array([want_loss], np.float32))


@pytest.mark.parametrize("B", SIZES)
def test_normalize_advantages(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    advantages = normal(rng, B, scale=3.0) + np.float32(1.5)
    got = ops.normalize_advantages(dev(advantages))
    want = npo.normalize_advantages(advantages)
    if B == 1:
        assert_exact(got, want)  # a batch of one normalises to 0, not NaN
    else:
        assert_close(got, want)


# --------------------------------------------------------------------------- value head
@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("B", SIZES)
def test_value_fwd_bwd(ops: CudaOps, rng: np.random.Generator, B: int, clip: float | None) -> None:
    returns = normal(rng, B)
    old_values = returns + normal(rng, B, scale=0.5)
    values = old_values + normal(rng, B, scale=0.3)
    # Keep |v - v_old| away from ε and |v_clip - R| away from |v - R|, where the gradient switches.
    delta = values.astype(np.float64) - old_values
    values[np.abs(np.abs(delta) - 0.2) < 1e-4] += np.float32(1e-3)
    if clip is not None:
        delta = values.astype(np.float64) - old_values
        clipped_err = old_values + np.clip(delta, -clip, clip) - returns
        err = values.astype(np.float64) - returns
        values[(np.abs(np.abs(clipped_err) - np.abs(err)) < 1e-4) & (np.abs(delta) > clip)] += (
            np.float32(3e-3)
        )
    loss, grad = ops.value_fwd_bwd(dev(values), dev(returns), dev(old_values), clip)
    want_loss, want_grad = npo.value_fwd_bwd(values, returns, old_values, clip)
    assert_close(loss, np.float32(want_loss))
    assert_close(grad, want_grad)


# --------------------------------------------------------------------------- perception heads
@pytest.mark.parametrize("B", SIZES)
def test_bce_fwd_bwd(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    u = normal(rng, B, scale=4.0)
    u[0] = 200.0  # softplus must not overflow
    if B > 1:
        u[1] = -200.0
    y = rng.integers(0, 2, B).astype(np.float32)
    loss, grad = ops.bce_fwd_bwd(dev(u), dev(y))
    want_loss, want_grad = npo.bce_fwd_bwd(u, y)
    assert_close(loss, np.float32(want_loss))
    assert_close(grad, want_grad)


@pytest.mark.parametrize("B", SIZES)
def test_aux_mse_fwd_bwd(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    K = ops.dims.K
    pred, target = normal(rng, B, K), normal(rng, B, K)
    loss, grad = ops.aux_mse_fwd_bwd(dev(pred), dev(target))
    want_loss, want_grad = npo.aux_mse_fwd_bwd(pred, target)
    assert_close(loss, np.float32(want_loss))
    assert_close(grad, want_grad)


# --------------------------------------------------------------------------- acting
def boundary_rows(logits: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Rows whose inverse-CDF threshold lies within 1e-5 of a cdf entry: an ulp of exp may
    move the sample there, on any two implementations."""
    cdf = np.cumsum(np.exp(npo.log_softmax(logits)), axis=-1)
    threshold = uniforms * cdf[:, -1]
    return np.any(np.abs(cdf - threshold[:, None]) <= 1e-5 * cdf[:, -1:], axis=1)


def assert_same_samples(got: np.ndarray, want: np.ndarray, near: np.ndarray) -> None:
    differ = got != want
    assert not np.any(differ & ~near), f"rows {np.flatnonzero(differ & ~near)[:10]} differ"
    assert np.all(np.abs(got[differ].astype(int) - want[differ]) == 1)  # neighbours at most


@pytest.mark.parametrize("B", SIZES)
def test_sample_categorical(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    logits = normal(rng, B, ops.dims.A, scale=2.0)
    uniforms = uniform01(rng.integers(0, 2**32, B, dtype=np.uint64).astype(np.uint32))
    uniforms[0] = 0.0
    got = host(ops.sample_categorical(dev(logits), dev(uniforms)))
    assert got.dtype == np.int32
    want = npo.sample_categorical(logits, uniforms)
    assert_same_samples(got, want, boundary_rows(logits, uniforms))


def trainer_for(dims: CudaDims, seed: int) -> Trainer:
    overrides = [
        f"model.obs_dim={dims.D}",
        f"model.hidden_dim={dims.H}",
        f"model.num_actions={dims.A}",
        f"model.aux_dim={dims.K}",
        f"c51.num_atoms={dims.Z}",
        f"train.seed={seed}",
        "train.backend=numpy",  # the host reference the kernels are compared with
    ]
    return Trainer(load_config(env={}, overrides=overrides))


@pytest.mark.parametrize("mode", list(ActMode), ids=lambda m: m.value)
@pytest.mark.parametrize("N", SIZES)
def test_act_select_matches_trainer_act(
    ops: CudaOps, rng: np.random.Generator, mode: ActMode, N: int
) -> None:
    """act_select on the trainer's own logits and Q-values, key and act_calls sequence gives
    Trainer.act's actions and log-probs."""
    dims = ops.dims
    trainer = trainer_for(dims, seed=int(rng.integers(2**63)))
    state = trainer.state
    state.counters["act_calls"][0] = int(rng.integers(2**40))  # sequence high word in use
    obs = normal(rng, N, dims.D)
    h = model.encoder_fwd(npo, state.params, obs, trainer.config.model.depth)[-1]
    logits = model.head_fwd(npo, state.params, "pi", h)
    probs = model.q_distribution(npo, state.params, h, dims.A, dims.Z)
    q = npo.c51_q_values(probs, state.support)
    for epsilon in (0.0, 0.1, 1 / 3, 1.0) if mode is ActMode.EPSILON_GREEDY else (0.0,):
        sequence = int(state.counters["act_calls"][0])
        want = trainer.act(obs, mode, epsilon)
        actions, log_probs = ops.act_select(dev(logits), dev(q), mode, epsilon, state.key, sequence)
        got = host(actions)
        assert got.dtype == np.int32
        if mode is ActMode.SAMPLE:
            bits = random_bits(state.key, Stream.ACT_SAMPLE, sequence, N)[:, 0]
            assert_same_samples(got, want.actions, boundary_rows(logits, uniform01(bits)))
            rows = np.flatnonzero(got == want.actions)
            assert_close(dev(host(log_probs)[rows]), want.log_probs[rows])
        else:
            assert_exact(actions, want.actions)
            assert_close(log_probs, want.log_probs)


def test_act_select_ties_and_device_scalars(ops: CudaOps, rng: np.random.Generator) -> None:
    """Greedy picks the first maximum (np.argmax); key, sequence and ε may live on the device."""
    A, N = ops.dims.A, 300
    logits = np.round(normal(rng, N, A), 1)  # many exact ties
    q = np.round(normal(rng, N, A), 1)
    key = (int(rng.integers(2**32)), int(rng.integers(2**32)))
    for mode, values in (("greedy_pi", logits), ("greedy_q", q)):
        actions, _ = ops.act_select(dev(logits), dev(q), mode, 0.0, key, 5)
        assert_exact(actions, np.argmax(values, axis=1).astype(np.int32))
    host_args = (0.25, key, 2**33 + 7)
    device_args = (
        cupy.asarray(np.array([0.25])),
        cupy.asarray(np.array(key, dtype=np.uint32)),
        cupy.asarray(np.array([2**33 + 7], dtype=np.int64)),
    )
    first = ops.act_select(dev(logits), dev(q), "epsilon_greedy", *host_args)
    second = ops.act_select(dev(logits), dev(q), "epsilon_greedy", *device_args)
    assert same_bytes(first[0], second[0]) and same_bytes(first[1], second[1])


def test_epsilon_coin_is_exact_for_unrepresentable_epsilon(
    ops: CudaOps, rng: np.random.Generator
) -> None:
    """ε just above a draw u (not a float32; float32(ε) = u) explores that row, as on the host;
    ε = u does not. A float32 compare against float32(ε) would get the first case wrong."""
    A, N, row = ops.dims.A, 4099, 17
    key, sequence = seed_key(int(rng.integers(2**63))), int(rng.integers(2**40))
    bits = random_bits(key, Stream.ACT_EXPLORE, sequence, N)
    u = uniform01(bits[:, 0], np.float64)
    q = normal(rng, N, A)
    greedy = np.argmax(q, axis=1)
    just_above = float(np.nextafter(u[row], 1.0))
    assert np.float32(just_above) == np.float32(u[row])
    for epsilon in (float(u[row]), just_above, 0.1, 0.7):
        want = np.where(u < epsilon, below(bits[:, 1], A), greedy).astype(np.int32)
        actions, _ = ops.act_select(dev(q), dev(q), ActMode.EPSILON_GREEDY, epsilon, key, sequence)
        assert_exact(actions, want)
        if epsilon == just_above and want[row] != greedy[row]:
            assert host(actions)[row] == want[row]


# --------------------------------------------------------------------------- minibatch rows
@pytest.mark.parametrize("B", SIZES)
def test_gather_rows(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    """One launch gathers every per-row field: the twin's arrays, bit for bit."""
    arrays = [
        normal(rng, B, 40),
        rng.integers(0, 9, B).astype(np.int32),
        normal(rng, B),
        normal(rng, B, 3),
        normal(rng, B, 0),
    ]
    rows = rng.permutation(B)[: max(1, B // 2)].astype(np.int32)
    got = ops.gather_rows([dev(a) for a in arrays], dev(rows))
    for g, w in zip(got, npo.gather_rows(arrays, rows), strict=True):
        np.testing.assert_array_equal(host(g), w)
        assert g.dtype == w.dtype
    with pytest.raises(ValueError, match=r"arrays\[1\]: expected dtype float32 or int32"):
        ops.gather_rows([dev(arrays[0]), dev(arrays[2].astype(np.float64))], dev(rows))
    with pytest.raises(ValueError, match=r"arrays: expected 1 to 8 arrays, got 9"):
        ops.gather_rows([dev(arrays[2])] * 9, dev(rows))
    with pytest.raises(ValueError, match=r"rows: expected dtype int32"):
        ops.gather_rows([dev(arrays[2])], dev(rows.astype(np.int64)))


# --------------------------------------------------------------------------- replay
def transitions(rng: np.random.Generator, count: int, D: int, A: int) -> Transitions:
    return Transitions(
        obs=normal(rng, count, D),
        actions=rng.integers(0, A, count).astype(np.int32),
        rewards=normal(rng, count),
        dones=(rng.random(count) < 0.3).astype(np.uint8),
        horizons=rng.integers(1, 4, count).astype(np.int32),
        next_obs=normal(rng, count, D),
    )


def test_replay_sample_and_gather_match_numpy(ops: CudaOps, rng: np.random.Generator) -> None:
    """The device ring (a ReplayBuffer on CuPy, as the trainer keeps it), drawn from and read
    by the ops, gives the NumPy ring's slots and rows exactly."""
    D, A, capacity = ops.dims.D, ops.dims.A, 37
    reference = ReplayBuffer(capacity, D, np.dtype(np.float32))
    ring = ReplayBuffer(capacity, D, np.dtype(np.float32), xp=cupy)
    key = seed_key(int(rng.integers(2**63)))
    for step, count in enumerate((5, 30, 1, 50, 74, 7)):  # wraps; 50 and 74 exceed capacity
        batch = transitions(rng, count, D, A)
        reference.insert(batch)
        ring.insert(batch)
        for count_out in SIZES:
            sequence = step * 2**31 + count_out  # past 2**32 for the later steps
            slots = ops.replay_sample_indices(ring.size_on_device, key, sequence, count_out)
            want_slots = below(
                random_bits(key, Stream.REPLAY, sequence, count_out)[:, 0], reference.size[0]
            ).astype(np.int32)
            assert_exact(slots, want_slots)
            twin = npo.replay_sample_indices(
                reference.size, np.array(key, np.uint32), np.array([sequence]), count_out
            )
            np.testing.assert_array_equal(twin, want_slots)
            got = ops.replay_gather(ring.storage, slots)
            want = npo.replay_gather(reference.storage, want_slots)
            for name in REPLAY_FIELDS:
                assert_exact(got[name], want[name])


# --------------------------------------------------------------------------- determinism
def test_every_op_twice_gives_the_same_bytes(ops: CudaOps, rng: np.random.Generator) -> None:
    H, A, Z, K, B = ops.dims.H, ops.dims.A, ops.dims.Z, ops.dims.K, 4099
    logits_q = dev(normal(rng, B, A, Z))
    actions = dev(rng.integers(0, A, B).astype(np.int32))
    target = dev(distributions(rng, B, Z))
    p, r, done, k = map(dev, projection_inputs(ops, rng, B))
    logits, acts, behavior, adv = map(dev, ppo_inputs(ops, rng, B, 0.2))
    v, R, v_old = dev(normal(rng, B)), dev(normal(rng, B)), dev(normal(rng, B))
    labels = dev((rng.random(B) < 0.5).astype(np.float32))
    pred, aux_target = dev(normal(rng, B, K)), dev(normal(rng, B, K))
    h, W = dev(normal(rng, B, H)), dev(normal(rng, H, A * Z))
    calls: list[Callable[[], object]] = [
        lambda: ops.c51_softmax(logits_q),
        lambda: ops.c51_greedy(logits_q, W[0], dev(npo.c51_support(V_MIN, V_MAX, Z, np.float32))),
        lambda: ops.c51_taken_loss_bwd(h, W, W[0], actions, target),
        lambda: ops.c51_taken_grad_params(h, actions, target, A),
        lambda: ops.categorical_projection(p, r, done, k, 0.99, V_MIN, V_MAX),
        lambda: ops.c51_support_clip_ratio(p, r, done, k, 0.99, V_MIN, V_MAX),
        lambda: ops.ppo_surrogate_fwd_bwd(logits, acts, behavior, adv, 0.2, 0.01),
        lambda: ops.normalize_advantages(adv),
        lambda: ops.value_fwd_bwd(v, R, v_old, 0.2),
        lambda: ops.bce_fwd_bwd(v, labels),
        lambda: ops.aux_mse_fwd_bwd(pred, aux_target),
        lambda: ops.act_select(logits, logits, "sample", 0.0, (1, 2), 3),
    ]

    def flat(result: object) -> list:
        if isinstance(result, dict):
            return [v for item in result.values() for v in flat(item)]
        if isinstance(result, tuple):
            return [v for item in result for v in flat(item)]
        return [result]

    for call in calls:
        first, second = flat(call()), flat(call())
        assert all(same_bytes(a, b) for a, b in zip(first, second, strict=True))


# --------------------------------------------------------------------------- validation
def test_launches_are_validated(ops: CudaOps, rng: np.random.Generator) -> None:
    """Wrong type, dtype, shape or layout raises ValueError naming the argument."""
    H, A, Z, B = ops.dims.H, ops.dims.A, ops.dims.Z, 8
    logits = dev(normal(rng, B, A, Z))
    actions = dev(np.zeros(B, np.int32))
    target = dev(distributions(rng, B, Z))
    rewards, flags, k = dev(normal(rng, B)), dev(np.zeros(B, np.uint8)), dev(np.ones(B, np.int32))
    pi = dev(normal(rng, B, A))
    gamma32 = cupy.asarray(np.array([0.99], np.float32))
    v = dev(normal(rng, B))
    h, W = dev(normal(rng, B, H)), dev(normal(rng, H, A * Z))
    cases = [
        (lambda: ops.c51_softmax(host(logits)), "logits: expected a cupy.ndarray"),
        (lambda: ops.c51_softmax(logits.astype(cupy.float64)), "logits: expected dtype float32"),
        (lambda: ops.c51_softmax(dev(normal(rng, B, A, Z + 1))), "logits: expected a cupy"),
        (
            lambda: ops.c51_greedy(logits, W[0, :-1], dev(normal(rng, Z))),
            "bias: expected shape",
        ),
        (
            lambda: ops.c51_taken_loss_bwd(h, W, W[0], actions.astype(cupy.int64), target),
            "actions: expected dtype int32",
        ),
        (
            lambda: ops.c51_taken_loss_bwd(h, W, W[0], actions, target[:, ::-1]),
            "target: expected a C-contiguous",
        ),
        (
            lambda: ops.c51_taken_loss_bwd(h, W[:-1], W[0], actions, target),
            "W: expected shape",
        ),
        (
            lambda: ops.c51_taken_grad_params(h, actions, target[:-1], A),
            "grad_taken: expected shape",
        ),
        (
            lambda: ops.c51_taken_grad_params(h, actions, target, A + 1),
            f"num_actions: expected {A}",
        ),
        (
            lambda: ops.categorical_projection(target, rewards, k, k, 0.99, V_MIN, V_MAX),
            "dones: expected dtype",
        ),
        (
            lambda: ops.categorical_projection(target, rewards, flags, k, gamma32, V_MIN, V_MAX),
            "gamma: expected dtype float64",
        ),
        (
            lambda: ops.categorical_projection(target, rewards, flags, k, 0.99, 1.0, -1.0),
            "v_max: expected a value above",
        ),
        (lambda: ops.act_select(pi, None, "greedy_q", 0.0, (0, 0), 0), "q_values: required"),
        (lambda: ops.act_select(pi, None, "greedy", 0.0, (0, 0), 0), "mode: expected one of"),
        (lambda: ops.act_select(pi, None, "sample", 0.0, (0, 2**32), 0), "key: expected"),
        (lambda: ops.act_select(pi, None, "sample", 0.0, (0, 0), -1), "sequence: expected"),
        (lambda: ops.act_select(pi, pi, "epsilon_greedy", 1.5, (0, 0), 0), "epsilon: expected"),
        (
            lambda: ops.value_fwd_bwd(v, dev(normal(rng, B + 1)), v, None),
            "returns: expected shape",
        ),
        (lambda: ops.bce_fwd_bwd(v, dev(np.zeros(B, np.uint8))), "y: expected dtype float32"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert sorted(ACT_MODES) == sorted(m.value for m in ActMode)


@pytest.mark.parametrize("rows", (1, 7, 300, 262_147))
def test_minibatch_order_matches_numpy(ops: CudaOps, rng: np.random.Generator, rows: int) -> None:
    """The device permutation equals the twin's stable argsort of the Philox keys element for
    element (ties, ~8 per 262k keys, broken by index on both), for sequences past 2**32."""
    key = tuple(int(w) for w in rng.integers(0, 2**32, 2))
    for sequence in (0, int(rng.integers(1, 2**31)), int(rng.integers(2**32, 2**40))):
        got = ops.minibatch_order(dev(np.array(key, dtype=np.uint32)), sequence, rows)
        want = npo.minibatch_order(np.array(key, dtype=np.uint32), sequence, rows)
        assert got.dtype == cupy.int32 and want.dtype == np.int32
        np.testing.assert_array_equal(host(got), want)
        assert np.array_equal(np.sort(want), np.arange(rows))
    with pytest.raises(ValueError, match="rows"):
        ops.minibatch_order(dev(np.array(key, dtype=np.uint32)), 0, 0)
    with pytest.raises(ValueError, match="sequence"):
        ops.minibatch_order(dev(np.array(key, dtype=np.uint32)), -1, rows)
