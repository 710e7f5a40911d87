"""Forward values and gradients of the NumPy op set against PyTorch autograd in float64.

Every reference here is PyTorch (float64) or a plain formula; no op is used to check itself.
Inputs are fresh random draws each run; the seed is printed (shown on failure) and can be
pinned with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from service.backend import numpy_ops as ops

TOL = 1e-9
A, Z, H, IN, K = 9, 51, 13, 11, 3  # odd sizes on purpose; H is not a power of two
BATCHES = (1, 7)


def t64(x: np.ndarray, grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=torch.float64, requires_grad=grad)


def rel_err(got: object, want: object) -> float:
    """max |got - want| / max(max |want|, tiny), per tensor."""
    if isinstance(want, torch.Tensor):
        want = want.detach().numpy()
    got_arr = np.asarray(got, dtype=np.float64)
    want_arr = np.asarray(want, dtype=np.float64)
    assert got_arr.shape == want_arr.shape, (got_arr.shape, want_arr.shape)
    scale = max(float(np.max(np.abs(want_arr), initial=0.0)), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(got_arr - want_arr), initial=0.0)) / scale


def assert_rel(got: object, want: object, name: str, tol: float = TOL) -> None:
    err = rel_err(got, want)
    assert err < tol, f"{name}: relative error {err:.3e} >= {tol:.0e}"


# --------------------------------------------------------------------------- linear layers
@pytest.mark.parametrize("B", BATCHES)
def test_linear_fwd_bwd(rng: np.random.Generator, B: int) -> None:
    x, W, b = rng.normal(size=(B, IN)), rng.normal(size=(IN, H)), rng.normal(size=H)
    grad_y = rng.normal(size=(B, H))
    xt, Wt, bt = t64(x, True), t64(W, True), t64(b, True)
    y = xt @ Wt + bt
    y.backward(t64(grad_y))
    assert_rel(ops.linear_fwd(x, W, b), y, "y")
    grad_x = ops.linear_bwd_input(W, grad_y)
    grad_W, grad_b = ops.linear_bwd_params(x, grad_y)
    assert_rel(grad_x, xt.grad, "grad_x")
    assert_rel(grad_W, Wt.grad, "grad_W")
    assert_rel(grad_b, bt.grad, "grad_b")


@pytest.mark.parametrize("B", BATCHES)
def test_bias_relu_fwd_bwd(rng: np.random.Generator, B: int) -> None:
    b = rng.normal(size=H)
    # Pre-activations at least 0.1 away from the kink, both signs.
    pre = rng.choice([-1.0, 1.0], size=(B, H)) * rng.uniform(0.1, 2.0, size=(B, H))
    z = pre - b
    grad_h = rng.normal(size=(B, H))
    zt, bt = t64(z, True), t64(b, True)
    ht = torch.relu(zt + bt)
    ht.backward(t64(grad_h))
    h = ops.bias_relu_fwd(z, b)
    assert_rel(h, ht, "h")
    grad_z = ops.bias_relu_bwd(h, grad_h)
    assert_rel(grad_z, zt.grad, "grad_z")
    # The bias gradient is the batch sum of grad_z.
    assert_rel(ops.reduce_axis0(grad_z), bt.grad, "grad_b")


def test_bias_relu_bwd_is_zero_at_the_kink(rng: np.random.Generator) -> None:
    h = np.maximum(rng.normal(size=(7, H)), 0)
    h[0, :4] = 0.0  # ReLU'(0) = 0
    grad_h = rng.normal(size=(7, H)) + 3.0
    grad_z = ops.bias_relu_bwd(h, grad_h)
    np.testing.assert_array_equal(grad_z[h == 0], 0.0)
    np.testing.assert_array_equal(grad_z[h > 0], grad_h[h > 0])


def test_reduce_axis0(rng: np.random.Generator) -> None:
    x = rng.normal(size=(7, H))
    assert_rel(ops.reduce_axis0(x), t64(x).sum(0), "sum")


# --------------------------------------------------------------------------- perception heads
@pytest.mark.parametrize("B", BATCHES)
def test_bce_fwd_bwd(rng: np.random.Generator, B: int) -> None:
    u = rng.normal(scale=3.0, size=B)
    y = rng.integers(0, 2, size=B).astype(np.float64)
    ut = t64(u, True)
    loss_t = F.binary_cross_entropy_with_logits(ut, t64(y), reduction="mean")
    loss_t.backward()
    loss, grad = ops.bce_fwd_bwd(u, y)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, ut.grad, "grad_u")


def test_bce_extreme_logits_stay_finite(rng: np.random.Generator) -> None:
    u = np.array([800.0, -800.0, 60.0, -60.0, 800.0, -800.0, 0.25])
    y = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    perm = rng.permutation(u.size)
    u, y = u[perm], y[perm]
    ut = t64(u, True)
    loss_t = F.binary_cross_entropy_with_logits(ut, t64(y), reduction="mean")
    loss_t.backward()
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        loss, grad = ops.bce_fwd_bwd(u, y)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, ut.grad, "grad_u")


@pytest.mark.parametrize("B", BATCHES)
def test_aux_mse_fwd_bwd(rng: np.random.Generator, B: int) -> None:
    pred, target = rng.normal(size=(B, K)), rng.normal(size=(B, K))
    pt = t64(pred, True)
    loss_t = F.mse_loss(pt, t64(target))
    loss_t.backward()
    loss, grad = ops.aux_mse_fwd_bwd(pred, target)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, pt.grad, "grad_pred")


# --------------------------------------------------------------------------- C51 head
@pytest.mark.parametrize("B", BATCHES)
def test_c51_softmax(rng: np.random.Generator, B: int) -> None:
    logits = rng.normal(scale=3.0, size=(B, A, Z))
    logits[0, 0] += 900.0  # a shifted row must not overflow
    probs = ops.c51_softmax(logits)
    assert_rel(probs, torch.softmax(t64(logits), dim=-1), "probs")
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("B", BATCHES)
def test_c51_greedy(rng: np.random.Generator, B: int) -> None:
    logits = rng.normal(scale=3.0, size=(B, A, Z))
    logits[0, 1, -1] += 900.0  # all of action 1's mass on the top atom: row 0's best ...
    logits[0, 3] = logits[0, 1]  # ... tied with action 3: the first of the two wins
    bias = rng.normal(scale=0.5, size=A * Z)
    bias[1 * Z : 2 * Z] = bias[3 * Z : 4 * Z]  # the tie survives the bias
    support = ops.c51_support(-10.0, 10.0, Z, np.dtype(np.float64))
    biased = logits + bias.reshape(A, Z)
    q = (torch.softmax(t64(biased), dim=-1) @ t64(support)).numpy()
    best, probs = ops.c51_greedy(logits, bias, support)
    assert best.dtype == np.int32 and best[0] == 1
    np.testing.assert_array_equal(best, np.argmax(q, axis=1))
    want = torch.softmax(t64(biased[np.arange(B), best]), dim=-1)
    assert_rel(probs, want, "probs")


def test_log_softmax(rng: np.random.Generator) -> None:
    logits = rng.normal(scale=3.0, size=(7, A))
    logits[3] += 700.0
    assert_rel(ops.log_softmax(logits), torch.log_softmax(t64(logits), dim=-1), "log_softmax")


def _random_target(rng: np.random.Generator, B: int, mass: float) -> np.ndarray:
    m = rng.random((B, Z)) ** 3  # uneven, strictly positive
    return mass * m / m.sum(-1, keepdims=True)


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("mass", [1.0, 0.7])
def test_c51_cross_entropy_fwd_bwd(rng: np.random.Generator, B: int, mass: float) -> None:
    logits = rng.normal(scale=2.0, size=(B, A, Z))
    actions = rng.integers(0, A, size=B)
    target = _random_target(rng, B, mass)
    rows = torch.arange(B)
    lt = t64(logits, True)
    taken = lt[rows, torch.from_numpy(actions)]
    loss_t = -(t64(target) * torch.log_softmax(taken, dim=-1)).sum(-1).mean()
    loss_t.backward()
    loss, grad_taken = ops.c51_cross_entropy_fwd_bwd(logits, actions, target)
    assert grad_taken.shape == (B, Z)
    assert_rel(loss, loss_t, "loss")
    full_grad = lt.grad.numpy()
    assert_rel(grad_taken, full_grad[np.arange(B), actions], "grad_taken")
    # The implied dense [B, A, Z] gradient: grad_taken on the taken action, zero elsewhere.
    implied = np.zeros_like(logits)
    implied[np.arange(B), actions] = grad_taken
    assert_rel(implied, full_grad, "full grad")
    other = np.ones((B, A), dtype=bool)
    other[np.arange(B), actions] = False
    np.testing.assert_array_equal(full_grad[other], 0.0)


@pytest.mark.parametrize("B", [1, 7, 23])
def test_c51_taken_loss_bwd(rng: np.random.Generator, B: int) -> None:
    h, W, b = rng.normal(size=(B, H)), rng.normal(size=(H, A * Z)), rng.normal(size=A * Z)
    actions = rng.integers(0, A, size=B)
    target = _random_target(rng, B, 1.0)
    ht, Wt, bt = t64(h, True), t64(W, True), t64(b, True)
    logits = (ht @ Wt + bt).reshape(B, A, Z)[torch.arange(B), torch.from_numpy(actions)]
    loss_t = -(t64(target) * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    loss_t.backward()
    loss, grad_h, grad_taken = ops.c51_taken_loss_bwd(h, W, b, actions, target)
    grad_W, grad_b = ops.c51_taken_grad_params(h, actions, grad_taken, A)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad_h, ht.grad, "grad_h")
    assert_rel(grad_W, Wt.grad, "grad_W")
    assert_rel(grad_b, bt.grad, "grad_b")


def test_c51_taken_loss_bwd_bad_action_is_nan_without_gradient(rng: np.random.Generator) -> None:
    B = 6
    h, W, b = rng.normal(size=(B, H)), rng.normal(size=(H, A * Z)), rng.normal(size=A * Z)
    actions = rng.integers(0, A, size=B)
    target = _random_target(rng, B, 1.0)
    _, clean_h, clean_taken = ops.c51_taken_loss_bwd(h[1:], W, b, actions[1:], target[1:])
    clean_W, clean_b = ops.c51_taken_grad_params(h[1:], actions[1:], clean_taken, A)
    actions[0] = A  # out of range
    loss, grad_h, grad_taken = ops.c51_taken_loss_bwd(h, W, b, actions, target)
    grad_W, grad_b = ops.c51_taken_grad_params(h, actions, grad_taken, A)
    assert np.isnan(loss)
    np.testing.assert_array_equal(grad_h[0], 0.0)
    np.testing.assert_array_equal(grad_taken[0], 0.0)
    # the other rows' gradients are the clean batch's, scaled by its size (the mean is over B)
    np.testing.assert_allclose(grad_h[1:] * B, clean_h * (B - 1), rtol=1e-12)
    np.testing.assert_allclose(grad_W * B, clean_W * (B - 1), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grad_b * B, clean_b * (B - 1), rtol=1e-12, atol=1e-15)


def _dense_taken_grad(grad_taken: np.ndarray, actions: np.ndarray) -> np.ndarray:
    B = grad_taken.shape[0]
    dense = np.zeros((B, A * Z))
    for row in range(B):
        a = int(actions[row])
        dense[row, a * Z : (a + 1) * Z] = grad_taken[row]
    return dense


@pytest.mark.parametrize("B", [1, 7, 23])
def test_c51_taken_grads(rng: np.random.Generator, B: int) -> None:
    """c51_taken_grad_h and c51_taken_grad_params: the head's backward from the taken action's
    logit gradient alone, against autograd through the dense head."""
    h, W, b = rng.normal(size=(B, H)), rng.normal(size=(H, A * Z)), rng.normal(size=A * Z)
    missing = int(rng.integers(A))  # this action gets no rows
    present = np.array([a for a in range(A) if a != missing])
    actions = rng.choice(present, size=B)
    grad_taken = rng.normal(size=(B, Z))
    ht, Wt, bt = t64(h, True), t64(W, True), t64(b, True)
    logits = ht @ Wt + bt
    logits.backward(t64(_dense_taken_grad(grad_taken, actions)))
    grad_h = ops.c51_taken_grad_h(W, actions, grad_taken)
    grad_W, grad_b = ops.c51_taken_grad_params(h, actions, grad_taken, A)
    assert_rel(grad_h, ht.grad, "grad_h")
    assert_rel(grad_W, Wt.grad, "grad_W")
    assert_rel(grad_b, bt.grad, "grad_b")
    cols = slice(missing * Z, (missing + 1) * Z)
    np.testing.assert_array_equal(grad_W[:, cols], 0.0)
    np.testing.assert_array_equal(grad_b[cols], 0.0)


def test_c51_loss_through_head_end_to_end(rng: np.random.Generator) -> None:
    B = 7
    h, W, b = rng.normal(size=(B, H)), 0.3 * rng.normal(size=(H, A * Z)), rng.normal(size=A * Z)
    actions = rng.integers(0, A, size=B)
    target = _random_target(rng, B, 1.0)
    ht, Wt, bt = t64(h, True), t64(W, True), t64(b, True)
    logits_t = (ht @ Wt + bt).reshape(B, A, Z)
    taken = logits_t[torch.arange(B), torch.from_numpy(actions)]
    loss_t = -(t64(target) * torch.log_softmax(taken, dim=-1)).sum(-1).mean()
    loss_t.backward()
    logits = ops.linear_fwd(h, W, b).reshape(B, A, Z)
    loss, grad_taken = ops.c51_cross_entropy_fwd_bwd(logits, actions, target)
    grad_h = ops.c51_taken_grad_h(W, actions, grad_taken)
    grad_W, grad_b = ops.c51_taken_grad_params(h, actions, grad_taken, A)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad_h, ht.grad, "grad_h")
    assert_rel(grad_W, Wt.grad, "grad_W")
    assert_rel(grad_b, bt.grad, "grad_b")


# --------------------------------------------------------------------------- PPO policy head
def _ppo_inputs(
    rng: np.random.Generator, B: int, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Logits, actions, behaviour log-probs and advantages covering every clip case.

    Sample i gets a ratio below 1-ε, inside, or above 1+ε (i mod 3, margin 0.02 in log space)
    and an advantage sign ((i // 3) mod 2), then the rows are shuffled.
    """
    logits = rng.normal(scale=1.5, size=(B, A))
    actions = rng.integers(0, A, size=B)
    lo, hi = np.log(1 - eps), np.log(1 + eps)
    bands = [(np.log(0.5), lo - 0.02), (lo + 0.02, hi - 0.02), (hi + 0.02, np.log(1.9))]
    case = np.arange(B) % 3
    sign = np.where((np.arange(B) // 3) % 2 == 0, 1.0, -1.0)
    if B == 1:
        case, sign = rng.integers(0, 3, size=1), rng.choice([-1.0, 1.0], size=1)
    log_ratio = np.array([rng.uniform(*bands[c]) for c in case])
    advantages = sign * rng.uniform(0.1, 2.0, size=B)
    perm = rng.permutation(B)
    log_ratio, advantages = log_ratio[perm], advantages[perm]
    log_pi = torch.log_softmax(t64(logits), dim=-1).numpy()
    behavior = log_pi[np.arange(B), actions] - log_ratio
    return logits, actions, behavior, advantages, log_ratio, sign[perm]


@pytest.mark.parametrize("B", [1, 7, 61])
@pytest.mark.parametrize(("eps", "ent_coef"), [(0.2, 0.013), (0.1, 0.0)])
def test_ppo_surrogate_fwd_bwd(
    rng: np.random.Generator, B: int, eps: float, ent_coef: float
) -> None:
    logits, actions, behavior, adv, log_ratio, sign = _ppo_inputs(rng, B, eps)
    if B >= 12:  # a good share of samples on every side of the clip range, both signs
        ratio = np.exp(log_ratio)
        for outside in (ratio < 1 - eps, ratio > 1 + eps):
            assert np.sum(outside & (sign > 0)) >= B // 8
            assert np.sum(outside & (sign < 0)) >= B // 8

    lt = t64(logits, True)
    log_p = torch.log_softmax(lt, dim=-1)
    log_p_a = log_p[torch.arange(B), torch.from_numpy(actions)]
    ratio_t = torch.exp(log_p_a - t64(behavior))
    adv_t = t64(adv)
    surrogate = torch.min(ratio_t * adv_t, torch.clamp(ratio_t, 1 - eps, 1 + eps) * adv_t)
    pg_loss_t = -surrogate.mean()
    entropy_t = -(torch.exp(log_p) * log_p).sum(-1).mean()
    loss_t = pg_loss_t - ent_coef * entropy_t
    loss_t.backward()
    with torch.no_grad():
        log_ratio_t = log_p_a - t64(behavior)
        approx_kl_t = ((ratio_t - 1) - log_ratio_t).mean()
        clip_fraction_t = ((ratio_t - 1).abs() > eps).to(torch.float64).mean()

    stats, grad = ops.ppo_surrogate_fwd_bwd(logits, actions, behavior, adv, eps, ent_coef)
    assert_rel(stats["loss"], loss_t, "loss")
    assert_rel(stats["pg_loss"], pg_loss_t, "pg_loss")
    assert_rel(stats["entropy"], entropy_t, "entropy")
    assert_rel(stats["approx_kl"], approx_kl_t, "approx_kl")
    assert float(stats["clip_fraction"]) == float(clip_fraction_t)
    assert_rel(grad, lt.grad, "grad_logits")


@pytest.mark.parametrize("B", (1, 7, 64))
def test_kickstart_fwd_bwd(rng: np.random.Generator, B: int) -> None:
    """weight · mean(-log π(a_teacher)) and its gradient, the teacher's action picked by the
    feature's sign (0 for a NaN), against autograd of the cross-entropy."""
    logits = rng.normal(scale=2.0, size=(B, A))
    feature = rng.choice([-2.5, -0.25, 0.0, 0.25, 1.0, np.nan], size=B)
    teacher_actions, weight = (5, 2, 6), float(rng.uniform(0.1, 3.0))
    want_actions = np.where(feature > 0, 6, np.where(feature < 0, 5, 2))
    lt = t64(logits, True)
    loss_t = weight * F.cross_entropy(lt, torch.from_numpy(want_actions))
    loss_t.backward()
    loss, grad = ops.kickstart_fwd_bwd(logits, feature, teacher_actions, weight)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, lt.grad, "grad_logits")
    zero_loss, zero_grad = ops.kickstart_fwd_bwd(logits, feature, teacher_actions, 0.0)
    assert float(zero_loss) == 0.0 and not zero_grad.any()  # a decayed weight: no pull


@pytest.mark.parametrize("silent", (0, 1, 2))
def test_kickstart_without_a_teacher_on_some_rows(rng: np.random.Generator, silent: int) -> None:
    """An action -1 (the teacher says nothing for that sign): those rows add nothing to the
    loss and get no gradient; the mean still counts every row."""
    B = 24
    logits, feature = rng.normal(size=(B, A)), rng.choice([-1.0, 0.0, 1.0], size=B)
    teacher_actions = [5, 2, 6]
    teacher_actions[silent] = -1
    sign = np.sign(feature).astype(int) + 1  # 0, 1, 2: below, zero, above
    taught = sign != silent
    want_actions = np.array(teacher_actions)[sign]
    lt = t64(logits, True)
    per_row = F.cross_entropy(lt, torch.from_numpy(np.where(taught, want_actions, 0)),
                              reduction="none")  # fmt: skip
    loss_t = 1.5 * (per_row * t64(taught)).sum() / B
    loss_t.backward()
    loss, grad = ops.kickstart_fwd_bwd(logits, feature, tuple(teacher_actions), 1.5)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, lt.grad, "grad_logits")
    assert not grad[~taught].any()


def test_normalize_advantages(rng: np.random.Generator) -> None:
    for B in (7, 61):
        adv = rng.normal(loc=rng.normal(), scale=rng.uniform(0.5, 3.0), size=B)
        at = t64(adv)
        want = (at - at.mean()) / (at.std(unbiased=False) + 1e-8)
        assert_rel(ops.normalize_advantages(adv), want, f"normalized B={B}")
    single = ops.normalize_advantages(rng.normal(size=1))
    np.testing.assert_array_equal(single, 0.0)
    np.testing.assert_array_equal(ops.normalize_advantages(np.full(7, 3.25)), 0.0)


# --------------------------------------------------------------------------- value head
@pytest.mark.parametrize("B", BATCHES)
def test_value_fwd_bwd_unclipped(rng: np.random.Generator, B: int) -> None:
    v, R, v_old = rng.normal(size=B), rng.normal(size=B), rng.normal(size=B)
    vt = t64(v, True)
    loss_t = (0.5 * (vt - t64(R)) ** 2).mean()
    loss_t.backward()
    loss, grad = ops.value_fwd_bwd(v, R, v_old, None)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, vt.grad, "grad_v")


@pytest.mark.parametrize("B", [1, 7, 61])
def test_value_fwd_bwd_clipped(rng: np.random.Generator, B: int) -> None:
    eps = 0.2
    v_old = rng.normal(size=B)
    # |v - v_old| inside the clip range (with margin), or outside it on either side.
    outside = rng.random(B) < 0.6
    step = np.where(
        outside,
        rng.choice([-1.0, 1.0], size=B) * rng.uniform(eps + 0.05, 1.0, size=B),
        rng.uniform(-eps + 0.02, eps - 0.02, size=B),
    )
    v = v_old + step
    R = v_old + rng.normal(scale=0.6, size=B)
    vt = t64(v, True)
    v_clip = t64(v_old) + torch.clamp(vt - t64(v_old), -eps, eps)
    loss_t = (0.5 * torch.max((vt - t64(R)) ** 2, (v_clip - t64(R)) ** 2)).mean()
    loss_t.backward()
    loss, grad = ops.value_fwd_bwd(v, R, v_old, eps)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, vt.grad, "grad_v")


def test_value_fwd_bwd_clipped_covers_both_branches(rng: np.random.Generator) -> None:
    """Hand-placed samples: the clipped branch wins (zero gradient) and loses (live gradient)."""
    eps = 0.2
    v_old = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, -1.0])
    v = np.array([0.5, 0.5, -0.5, 0.1, 1.05, 0.3, -1.6])
    R = np.array([0.6, -0.4, -0.6, 0.9, 0.0, 1.1, -1.7])
    shift = rng.normal()
    v_old, v, R = v_old + shift, v + shift, R + shift
    vt = t64(v, True)
    v_clip = t64(v_old) + torch.clamp(vt - t64(v_old), -eps, eps)
    loss_t = (0.5 * torch.max((vt - t64(R)) ** 2, (v_clip - t64(R)) ** 2)).mean()
    loss_t.backward()
    loss, grad = ops.value_fwd_bwd(v, R, v_old, eps)
    assert_rel(loss, loss_t, "loss")
    assert_rel(grad, vt.grad, "grad_v")
    # Samples 0, 2, 6: the clipped (flat) branch is the max; 1, 5: outside but unclipped wins.
    np.testing.assert_array_equal(grad[[0, 2, 6]], 0.0)
    assert np.all(grad[[1, 3, 4, 5]] != 0)


# --------------------------------------------------------------------------- encoder gradient
@pytest.mark.parametrize("B", BATCHES)
def test_grad_h_accumulate(rng: np.random.Generator, B: int) -> None:
    grads = [rng.normal(size=(B, H)) for _ in range(3)]
    weights = list(rng.uniform(0.1, 2.0, size=3))
    want = sum(w * t64(g) for w, g in zip(weights, grads, strict=True))
    assert_rel(ops.grad_h_accumulate(grads, weights), want, "grad_h")
    assert_rel(ops.grad_h_accumulate(grads[:1], weights[:1]), weights[0] * t64(grads[0]), "one")


# --------------------------------------------------------------------------- gradient clipping
@pytest.mark.parametrize("ratio", [0.3, 10.0])
def test_global_norm_and_clip_coefficient(rng: np.random.Generator, ratio: float) -> None:
    shapes = [(IN, H), (H,), (H, A * Z), (A * Z,), (1,)]
    grads = [rng.normal(size=s) for s in shapes]
    norm = ops.global_norm(grads)
    assert norm.shape == (1,) and norm.dtype == np.float64
    max_norm = ratio * float(np.sqrt(sum(float(np.sum(g * g)) for g in grads)))
    params = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    for p, g in zip(params, grads, strict=True):
        p.grad = t64(g)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    assert_rel(norm, total.reshape(1), "norm", tol=1e-12)
    coef = ops.clip_coefficient(norm, max_norm)
    assert coef.shape == (1,)
    if ratio > 1:
        assert coef[0] == 1.0
    else:
        assert coef[0] < 1.0
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        assert_rel(g * coef[0], p.grad, f"clipped grad {i}", tol=1e-12)


# --------------------------------------------------------------------------- acting
def test_sample_categorical_frequencies(rng: np.random.Generator) -> None:
    n = 60_000
    rows = rng.normal(scale=1.2, size=(3, A))
    logits = np.repeat(rows, n, axis=0)
    uniforms = rng.random(logits.shape[0])
    picks = ops.sample_categorical(logits, uniforms)
    assert picks.dtype == np.int32 and picks.shape == (logits.shape[0],)
    assert picks.min() >= 0 and picks.max() < A
    probs = torch.softmax(t64(rows), dim=-1).numpy()
    for r in range(3):
        freq = np.bincount(picks[r * n : (r + 1) * n], minlength=A) / n
        tol = 5 * np.sqrt(probs[r] * (1 - probs[r]) / n) + 1e-4
        assert np.all(np.abs(freq - probs[r]) <= tol), (freq, probs[r])


def test_sample_categorical_cdf_boundaries(rng: np.random.Generator) -> None:
    row = rng.normal(scale=0.8, size=A)
    probs = torch.softmax(t64(row), dim=-1).tolist()
    cdf, running = [], 0.0
    for p in probs:
        running += p
        cdf.append(running)
    gap = 1e-9
    uniforms, expected = [0.0, 1 - 2.0**-24], [0, A - 1]
    for k in range(A - 1):  # u just below cdf_k picks k; just above picks k + 1
        uniforms += [cdf[k] - gap, cdf[k] + gap]
        expected += [k, k + 1]
    logits = np.tile(row, (len(uniforms), 1))
    picks = ops.sample_categorical(logits, np.array(uniforms))
    np.testing.assert_array_equal(picks, np.array(expected))


def test_sample_categorical_tie_goes_to_the_next_action(rng: np.random.Generator) -> None:
    """u·Σπ exactly equal to a running sum picks the next action (the sum must exceed u·Σπ)."""
    if np.exp(-np.log(4.0)) != 0.25:  # four equal logits give exact quarters on this platform
        pytest.skip("exp(-log 4) is not exactly 0.25 here")
    logits = np.full((5, 4), rng.normal())
    picks = ops.sample_categorical(logits, np.array([0.0, 0.25, 0.5, 0.75, 0.75 - 2.0**-24]))
    np.testing.assert_array_equal(picks, [0, 1, 2, 3, 2])


@pytest.mark.parametrize("layout", [(2, 3), (1, 0, 4), (5,)])
def test_group_norms_clip_each_group_as_torch_clips_it_alone(
    rng: np.random.Generator, layout: tuple[int, ...]
) -> None:
    """group_norms + clip_coefficient on each group equal torch's clip_grad_norm_ run on that
    group's tensors alone; the last entry is the norm over all of them."""
    shapes = [(IN, H), (H,), (H, A * Z), (A * Z,), (1,)]
    grads = [rng.normal(size=shapes[i % len(shapes)]) * rng.uniform(0.1, 30)
             for i in range(sum(layout))]  # fmt: skip
    norms = ops.group_norms(grads, layout)
    assert norms.shape == (len(layout) + 1,) and norms.dtype == np.float64
    np.testing.assert_array_equal(norms[-1:], ops.global_norm(grads))
    max_norm = float(rng.uniform(0.5, 5.0))
    coefficients = ops.clip_coefficient(norms[:-1], max_norm)
    start = 0
    for j, count in enumerate(layout):
        params = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
                  for g in grads[start : start + count]]  # fmt: skip
        for p, g in zip(params, grads[start : start + count], strict=True):
            p.grad = t64(g)
        total = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.zeros(())
        assert_rel(norms[j : j + 1], total.reshape(1), f"group {j} norm", tol=1e-12)
        for i, (p, g) in enumerate(zip(params, grads[start : start + count], strict=True)):
            assert_rel(g * coefficients[j], p.grad, f"group {j} tensor {i}", tol=1e-12)
        start += count
    with pytest.raises(ValueError, match="group_sizes"):
        ops.group_norms(grads, (*layout, 1))
