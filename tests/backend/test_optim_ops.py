"""Optimizer-side ops: AdamW against torch.optim.AdamW, the ok guard, target refresh and
the finiteness check (the op set itself: tests/backend/test_opset.py).

Random inputs are fresh each run; the seed is printed (shown on failure) and can be pinned
with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.backend import numpy_ops as ops

SHAPES = [(7, 9), (9,), (1, 13)]


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(want))), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want))) / scale


# --------------------------------------------------------------------------- AdamW
@pytest.mark.parametrize(
    ("lr", "betas", "eps", "weight_decay"),
    [
        (1e-2, (0.9, 0.999), 1e-8, 0.01),
        (3e-3, (0.8, 0.95), 1e-6, 0.0),
        (0.05, (0.5, 0.9), 1e-3, 0.3),
    ],
)
def test_adamw_matches_torch(
    rng: np.random.Generator,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    params = [rng.normal(size=s) for s in SHAPES]
    torch_params = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    opt = torch.optim.AdamW(
        torch_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False
    )
    exp_avg = [np.zeros_like(p) for p in params]
    exp_avg_sq = [np.zeros_like(p) for p in params]
    step = np.zeros(1, dtype=np.int64)
    ok = np.ones(1, dtype=np.uint8)
    for _ in range(5):
        grads = [rng.normal(scale=rng.uniform(0.1, 3.0), size=s) for s in SHAPES]
        scale = np.array([rng.uniform(0.2, 0.9)])  # a clip coefficient != 1
        for tp, g in zip(torch_params, grads, strict=True):
            tp.grad = torch.tensor(g * scale[0], dtype=torch.float64)
        opt.step()
        grads_before = [g.copy() for g in grads]
        ops.advance_counter(step, ok)
        for i, p in enumerate(params):
            ops.adamw_step(
                p, grads[i], exp_avg[i], exp_avg_sq[i], step,
                lr, betas[0], betas[1], eps, weight_decay, scale, ok,
            )  # fmt: skip
        for g, g0 in zip(grads, grads_before, strict=True):
            np.testing.assert_array_equal(g, g0)  # the gradient is not modified
        for i, tp in enumerate(torch_params):
            state = opt.state[tp]
            assert int(state["step"]) == int(step[0])
            assert rel_err(params[i], tp.detach().numpy()) < 1e-12, f"param {i}"
            assert rel_err(exp_avg[i], state["exp_avg"].numpy()) < 1e-12, f"exp_avg {i}"
            assert rel_err(exp_avg_sq[i], state["exp_avg_sq"].numpy()) < 1e-12, f"exp_avg_sq {i}"
    assert step[0] == 5


def test_adamw_float32_stays_float32(rng: np.random.Generator) -> None:
    p64 = rng.normal(size=(7, 9))
    p32 = p64.astype(np.float32)
    states = {
        dt: (np.zeros_like(p), np.zeros_like(p), np.zeros(1, dtype=np.int64))
        for dt, p in ((np.float64, p64), (np.float32, p32))
    }
    ok = np.ones(1, dtype=np.uint8)
    for _ in range(3):
        g = rng.normal(size=(7, 9))
        for dt, p in ((np.float64, p64), (np.float32, p32)):
            m, v, step = states[dt]
            ops.advance_counter(step, ok)
            ops.adamw_step(p, g.astype(dt), m, v, step, 1e-2, 0.9, 0.999, 1e-8, 0.01, [0.5], ok)
    assert p32.dtype == np.float32
    assert all(a.dtype == np.float32 for a in states[np.float32][:2])
    np.testing.assert_allclose(p32, p64, rtol=0, atol=1e-5)


def test_ok_zero_leaves_everything_unchanged(rng: np.random.Generator) -> None:
    param = rng.normal(size=(7, 9))
    exp_avg, exp_avg_sq = rng.normal(size=(7, 9)), rng.random((7, 9))
    step = np.array([int(rng.integers(1, 100))], dtype=np.int64)
    before = [a.tobytes() for a in (param, exp_avg, exp_avg_sq, step)]
    ok = np.zeros(1, dtype=np.uint8)
    for grad in (rng.normal(size=(7, 9)), np.full((7, 9), np.nan), np.full((7, 9), np.inf)):
        ops.advance_counter(step, ok)
        ops.adamw_step(
            param, grad, exp_avg, exp_avg_sq, step, 1e-2, 0.9, 0.999, 1e-8, 0.01, [0.7], ok
        )
        assert [a.tobytes() for a in (param, exp_avg, exp_avg_sq, step)] == before
    ops.advance_counter(step, np.ones(1, dtype=np.uint8))
    assert step.tobytes() != before[3]


def test_advance_counter(rng: np.random.Generator) -> None:
    start = int(rng.integers(0, 1000))
    counter = np.array([start], dtype=np.int64)
    flags = rng.integers(0, 2, size=17).astype(np.uint8)
    for flag in flags:
        ops.advance_counter(counter, np.array([flag], dtype=np.uint8))
    assert counter.dtype == np.int64 and counter[0] == start + int(flags.sum())


def test_advance_counters_advances_each_once_and_refuses_a_repeat(
    rng: np.random.Generator,
) -> None:
    starts = rng.integers(0, 1000, size=5)
    counters = [np.array([v], dtype=np.int64) for v in starts]
    ops.advance_counters(counters, np.ones(1, dtype=np.uint8))
    assert [int(c[0]) for c in counters] == [int(v) + 1 for v in starts]
    with pytest.raises(ValueError, match="counters: expected distinct arrays"):
        ops.advance_counters([counters[0], counters[1], counters[0]], np.ones(1, dtype=np.uint8))
    assert [int(c[0]) for c in counters] == [int(v) + 1 for v in starts]  # nothing changed


# --------------------------------------------------------------------------- target refresh
def test_target_refresh_hard_copies_on_period_multiples(rng: np.random.Generator) -> None:
    period = 3
    online = [rng.normal(size=s) for s in SHAPES]
    target = [rng.normal(size=s) for s in SHAPES]
    ok = np.ones(1, dtype=np.uint8)
    for update in range(1, 11):
        for o in online:
            o += rng.normal(size=o.shape)
        previous = [t.copy() for t in target]
        ops.target_refresh(target, online, np.array([update]), period, 0.0, ok)
        want = online if update % period == 0 else previous
        for t, w in zip(target, want, strict=True):
            np.testing.assert_array_equal(t, w)
    # A copy, not an alias: later changes to the online network do not leak into the target.
    snapshot = [t.copy() for t in target]
    for o in online:
        o += 1.0
    for t, s in zip(target, snapshot, strict=True):
        np.testing.assert_array_equal(t, s)
    # ok = [0] on a multiple of the period: no copy.
    ops.target_refresh(target, online, np.array([2 * period]), period, 0.0, np.zeros(1, np.uint8))
    for t, s in zip(target, snapshot, strict=True):
        np.testing.assert_array_equal(t, s)


@pytest.mark.parametrize("tau", [0.005, 0.3, 1.0])
def test_target_refresh_polyak(rng: np.random.Generator, tau: float) -> None:
    online = [rng.normal(size=s) for s in SHAPES]
    target = [rng.normal(size=s) for s in SHAPES]
    expected = [t.copy() for t in target]
    ok = np.ones(1, dtype=np.uint8)
    for update in range(1, 6):
        for o in online:
            o += rng.normal(size=o.shape)
        ops.target_refresh(target, online, np.array([update]), 1000, tau, ok)
        expected = [tau * o + (1 - tau) * e for o, e in zip(online, expected, strict=True)]
        for t, e in zip(target, expected, strict=True):
            assert rel_err(t, e) < 1e-12
    before = [t.tobytes() for t in target]
    ops.target_refresh(target, online, np.array([6]), 1000, tau, np.zeros(1, np.uint8))
    assert [t.tobytes() for t in target] == before


# --------------------------------------------------------------------------- finiteness
def test_all_finite(rng: np.random.Generator) -> None:
    arrays = [rng.normal(size=s) for s in SHAPES] + [rng.normal(size=5).astype(np.float32)]
    ok = ops.all_finite(arrays)
    assert ok.dtype == np.uint8 and ok.shape == (1,) and ok[0] == 1
    for i, array in enumerate(arrays):
        for bad in (np.nan, np.inf, -np.inf):
            broken = [a.copy() for a in arrays]
            flat = broken[i].reshape(-1)
            flat[int(rng.integers(flat.size))] = bad
            result = ops.all_finite(broken)
            assert result.dtype == np.uint8 and result.shape == (1,)
            assert result[0] == 0, f"{bad} in array {i} not detected"
        assert np.all(np.isfinite(array))  # inputs untouched
