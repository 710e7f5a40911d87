"""The core CUDA kernels against their NumPy twins (service/backend/numpy_ops.py).

Error measure: max |gpu - numpy| / scale per tensor, below 1e-5, where scale is max |numpy|,
or for sums the largest Σ|terms| (a bound that cancellation cannot shrink to zero).
Batch sizes avoid multiples of the block size; H = 256 and 37. Random inputs are fresh each
run; the seed is printed and can be pinned with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="no CUDA device visible to CuPy (cupy is not installed)")

from service.backend import numpy_ops as npo  # noqa: E402
from service.backend.cuda import loader  # noqa: E402
from service.backend.cuda.loader import CudaDims, load_kernel  # noqa: E402
from service.backend.cuda.ops import CudaOps  # noqa: E402
from service.backend.philox import philox4x32  # noqa: E402

from .conftest import assert_close, dev, host, normal, same_bytes  # noqa: E402

SIZES = (1, 7, 255, 1000, 4099)
WIDTHS = (256, 37)
HP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


# --------------------------------------------------------------------------- helpers
# normal, dev, host, assert_close, same_bytes, TOL: tests/gpu/conftest.py; rng: tests/conftest.py
@pytest.fixture(scope="module", params=WIDTHS, ids=lambda h: f"H{h}")
def ops(request: pytest.FixtureRequest) -> CudaOps:
    return CudaOps(CudaDims(D=16, H=request.param, A=9, Z=51, K=4))


@pytest.fixture(scope="module")
def core() -> CudaOps:
    return CudaOps(CudaDims(D=16, H=256, A=9, Z=51, K=4))


def flag(value: int) -> np.ndarray:
    return np.array([value], dtype=np.uint8)


# --------------------------------------------------------------------------- Philox
def test_philox_kernel_matches_python(rng: np.random.Generator) -> None:
    """common.cuh's Philox4x32-10 on the device equals philox.py bit for bit."""
    kernel = load_kernel("philox_test.cu", "philox_test")
    kat = np.array([[0] * 4, [0xFFFFFFFF] * 4], dtype=np.uint32)
    counters = np.concatenate([kat, rng.integers(0, 2**32, (4097, 4), dtype=np.uint64)])
    counters = counters.astype(np.uint32)
    for key in [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), tuple(int(k) for k in rng.integers(0, 2**32, 2))]:
        out = cupy.empty(counters.shape, dtype=cupy.uint32)
        n = counters.shape[0]
        args = (dev(counters), np.int32(n), np.uint32(key[0]), np.uint32(key[1]), out)
        kernel(((n + 255) // 256,), (256,), args)
        np.testing.assert_array_equal(host(out), philox4x32(counters, key))


# --------------------------------------------------------------------------- encoder
@pytest.mark.parametrize("B", SIZES)
def test_bias_relu_fwd(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    H = ops.dims.H
    z, b = normal(rng, B, H), normal(rng, H)
    z[0, : H // 2] = -b[: H // 2]  # z + b == 0 exactly: ReLU'(0) edge
    assert_close(ops.bias_relu_fwd(dev(z), dev(b)), npo.bias_relu_fwd(z, b))


@pytest.mark.parametrize("B", SIZES)
def test_bias_relu_bwd(ops: CudaOps, rng: np.random.Generator, B: int) -> None:
    H = ops.dims.H
    h = np.maximum(normal(rng, B, H), 0)
    grad_h = normal(rng, B, H)
    assert_close(ops.bias_relu_bwd(dev(h), dev(grad_h)), npo.bias_relu_bwd(h, grad_h))


def test_bias_relu_non_finite_as_numpy(ops: CudaOps, rng: np.random.Generator) -> None:
    """NaN passes through the forward; a non-finite grad_h stays non-finite where h = 0."""
    H = ops.dims.H
    z, b = normal(rng, 3, H), normal(rng, H)
    z[0, 0], z[1, 1], z[2, 2] = np.nan, np.inf, -np.inf
    np.testing.assert_array_equal(host(ops.bias_relu_fwd(dev(z), dev(b))), npo.bias_relu_fwd(z, b))
    h = npo.bias_relu_fwd(normal(rng, 3, H), b)
    h[:, 0] = 0
    grad_h = normal(rng, 3, H)
    grad_h[0, 0], grad_h[1, 0], grad_h[2, 0] = np.inf, np.nan, -np.inf
    got = host(ops.bias_relu_bwd(dev(h), dev(grad_h)))
    np.testing.assert_array_equal(got, npo.bias_relu_bwd(h, grad_h))
    assert np.isnan(got[:, 0]).all()


# --------------------------------------------------------------------------- reduce_axis0
def assert_sum_close(got: cupy.ndarray, x: np.ndarray) -> None:
    scale = float(np.max(np.sum(np.abs(x.astype(np.float64)), axis=0), initial=0.0))
    assert_close(got, npo.reduce_axis0(x), scale=scale)


@pytest.mark.parametrize("B", (*SIZES, 1025, 20000, 300_001))
@pytest.mark.parametrize("cols", (256, 37, 1))
def test_reduce_axis0(core: CudaOps, rng: np.random.Generator, B: int, cols: int) -> None:
    if B * cols > 20_000_000:
        cols = 3
    x = normal(rng, B, cols)
    assert_sum_close(core.reduce_axis0(dev(x)), x)


@pytest.mark.parametrize("shape", [(1,), (4099,), (255, 9, 51), (4099, 0)])
def test_reduce_axis0_shapes(core: CudaOps, rng: np.random.Generator, shape: tuple) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    assert_sum_close(core.reduce_axis0(dev(x)), x)


@pytest.mark.parametrize("B", (1, 7, 255, 1000, 1024))
@pytest.mark.parametrize("cols", (256, 37))
def test_reduce_axis0_is_numpys_order(
    core: CudaOps, rng: np.random.Generator, B: int, cols: int
) -> None:
    """Up to 1024 rows the sum runs row after row, as np.add.reduce(axis=0) does for >= 2
    columns: the same float32 roundings, so the same bits."""
    x = normal(rng, B, cols) * np.float32(1000)
    np.testing.assert_array_equal(host(core.reduce_axis0(dev(x))), npo.reduce_axis0(x))


# --------------------------------------------------------------------------- linear layers
@pytest.mark.parametrize("B", SIZES)
def test_linear(core: CudaOps, rng: np.random.Generator, B: int) -> None:
    x, W, b, g = normal(rng, B, 37), normal(rng, 37, 29), normal(rng, 29), normal(rng, B, 29)
    ax, aW, ag = np.abs(x), np.abs(W), np.abs(g)
    assert_close(
        core.linear_fwd(dev(x), dev(W), dev(b)),
        npo.linear_fwd(x, W, b),
        scale=float(np.max(ax @ aW + np.abs(b))),
    )
    grad_x = core.linear_bwd_input(dev(W), dev(g))
    grad_W, grad_b = core.linear_bwd_params(dev(x), dev(g))
    want_W, want_b = npo.linear_bwd_params(x, g)
    assert_close(grad_x, npo.linear_bwd_input(W, g), scale=float(np.max(ag @ aW.T)))
    assert_close(grad_W, want_W, scale=float(np.max(ax.T @ ag)))
    assert_close(grad_b, want_b, scale=float(np.max(ag.sum(axis=0))))


@pytest.mark.parametrize("B", SIZES)
def test_matmul_and_its_capture(core: CudaOps, rng: np.random.Generator, B: int) -> None:
    """The ctypes SGEMM (gemm.py) against NumPy, with either operand transposed; the same
    call captured in a CUDA graph and replayed writes the eager bytes."""
    import cupy

    from service.backend.cuda.capture import CapturedCalls
    from service.backend.cuda.gemm import gemm

    a, b, c = normal(rng, B, 37), normal(rng, 37, 29), normal(rng, B, 29)
    assert_close(core.matmul(dev(a), dev(b)), a @ b, scale=float(np.max(np.abs(a) @ np.abs(b))))
    assert_close(
        gemm(dev(a), dev(c), trans_a=True), a.T @ c, scale=float(np.max(np.abs(a.T) @ np.abs(c)))
    )
    assert_close(
        gemm(dev(c), dev(b), trans_b=True), c @ b.T, scale=float(np.max(np.abs(c) @ np.abs(b.T)))
    )
    stream = cupy.cuda.Stream(non_blocking=True)
    calls = CapturedCalls(stream)
    inputs = dev(a), dev(b), dev(c)
    fn = lambda: (core.matmul(inputs[0], inputs[1]), gemm(inputs[0], inputs[2], trans_a=True))  # noqa: E731
    with stream:
        eager = [host(y) for y in calls.run("mm", fn)]
        for _ in range(2):  # captured (and launched), then replayed
            replayed = [host(y) for y in calls.run("mm", fn)]
            assert [y.tobytes() for y in replayed] == [y.tobytes() for y in eager]
    assert calls.captures == 1


# --------------------------------------------------------------------------- grad_h
@pytest.mark.parametrize("top", (0, 1, 255, 4099))
@pytest.mark.parametrize("bottom", (0, 7, 4096))
def test_grad_h_stack(ops: CudaOps, rng: np.random.Generator, top: int, bottom: int) -> None:
    """[top; λ bottom] equals the twin bit for bit (a copy and one float32 multiply)."""
    H = ops.dims.H
    a, b = normal(rng, top, H), normal(rng, bottom, H)
    weight = float(rng.uniform(0.1, 2.0))
    want = npo.grad_h_stack(a, b, weight)
    got = ops.grad_h_stack(dev(a), dev(b), weight)
    np.testing.assert_array_equal(host(got), want)
    on_device = cupy.asarray(np.array([weight], dtype=np.float64))
    assert same_bytes(ops.grad_h_stack(dev(a), dev(b), on_device), got)


# --------------------------------------------------------------------------- narrow heads
# 17 and 40: several column passes; 512 columns: two outputs per thread, features in stages
HEAD_WIDTHS = [(9, 1, 1, 3), (9, 1), (1,), (40, 1, 17, 2), (300, 200, 5, 7)]


@pytest.mark.parametrize("B", (0, *SIZES, 20000))
@pytest.mark.parametrize("widths", HEAD_WIDTHS, ids=lambda w: "w" + "-".join(map(str, w)))
def test_linear_heads(
    ops: CudaOps, rng: np.random.Generator, B: int, widths: tuple[int, ...]
) -> None:
    """The fused narrow heads against per-head linear_fwd / linear_bwd_input /
    linear_bwd_params + grad_h_accumulate (the NumPy twins)."""
    H = ops.dims.H
    h = np.maximum(normal(rng, B, H), 0)
    Ws = [normal(rng, H, w) for w in widths]
    bs = [normal(rng, w) for w in widths]
    gs = [normal(rng, B, w) for w in widths]
    weights = [float(x) for x in rng.uniform(0.1, 2.0, len(widths))]
    ah = np.abs(h)
    outs = ops.linear_heads_fwd(dev(h), [dev(W) for W in Ws], [dev(b) for b in bs])
    for got, want, W, b in zip(outs, npo.linear_heads_fwd(h, Ws, bs), Ws, bs, strict=True):
        assert_close(got, want, scale=float(np.max(ah @ np.abs(W) + np.abs(b), initial=0.0)))
    grad_h = ops.linear_heads_bwd_input([dev(W) for W in Ws], [dev(g) for g in gs], weights)
    grad_Ws, grad_bs = ops.linear_heads_bwd_params(dev(h), [dev(g) for g in gs])
    want_h = npo.linear_heads_bwd_input(Ws, gs, weights)
    want_Ws, want_bs = npo.linear_heads_bwd_params(h, gs)
    bound = sum(w * (np.abs(g) @ np.abs(W).T) for w, g, W in zip(weights, gs, Ws, strict=True))
    assert_close(grad_h, want_h, scale=float(np.max(bound, initial=0.0)))
    for got_W, got_b, want_W, want_b, g in zip(grad_Ws, grad_bs, want_Ws, want_bs, gs, strict=True):
        assert_close(got_W, want_W, scale=float(np.max(ah.T @ np.abs(g), initial=0.0)))
        assert_close(got_b, want_b, scale=float(np.max(np.abs(g).sum(axis=0), initial=0.0)))
    again = ops.linear_heads_bwd_input([dev(W) for W in Ws], [dev(g) for g in gs], weights)
    assert same_bytes(again, grad_h)
    again_Ws, again_bs = ops.linear_heads_bwd_params(dev(h), [dev(g) for g in gs])
    repeated = zip(again_Ws + again_bs, grad_Ws + grad_bs, strict=True)
    assert all(same_bytes(a, b) for a, b in repeated)


def test_linear_heads_fwd_sums_in_its_documented_order(
    ops: CudaOps, rng: np.random.Generator
) -> None:
    """linear_heads.cu's order, emulated in float32 (each product and add rounded, as the
    kernels compile with --fmad=false): p_m over the features k = m mod 4 below H rounded down
    to 4, the last H mod 4 features into p_0, then ((p_0 + p_1) + (p_2 + p_3)) + b. Bit for bit,
    so a change of order fails here and not only in the golden record."""
    H, B = ops.dims.H, 77
    widths = (9, 1, 17)
    h = np.maximum(normal(rng, B, H), 0)
    Ws = [normal(rng, H, w) for w in widths]
    bs = [normal(rng, w) for w in widths]
    got = ops.linear_heads_fwd(dev(h), [dev(W) for W in Ws], [dev(b) for b in bs])
    for out, W, b in zip(got, Ws, bs, strict=True):
        p = np.zeros((4, B, W.shape[1]), dtype=np.float32)
        paired = H // 4 * 4
        for k in range(H):
            m = k % 4 if k < paired else 0
            p[m] = p[m] + h[:, k : k + 1] * W[k]
        want = ((p[0] + p[1]) + (p[2] + p[3])) + b
        np.testing.assert_array_equal(host(out), want)


def test_linear_heads_bad_input(core: CudaOps, rng: np.random.Generator) -> None:
    h = dev(normal(rng, 5, 256))
    Ws = [dev(normal(rng, 256, 9)), dev(normal(rng, 256, 1))]
    bs = [dev(normal(rng, 9)), dev(normal(rng, 1))]
    with pytest.raises(ValueError, match=r"Ws\[1\]: expected shape \[256, width >= 1\]"):
        core.linear_heads_fwd(h, [Ws[0], dev(normal(rng, 255, 1))], bs)
    with pytest.raises(ValueError, match=r"bs\[0\]: expected shape \[9\]"):
        core.linear_heads_fwd(h, Ws, [dev(normal(rng, 8)), bs[1]])
    with pytest.raises(ValueError, match=r"Ws: expected 1 to 4 arrays, got 5"):
        core.linear_heads_fwd(h, Ws * 2 + Ws[:1], bs * 2 + bs[:1])
    with pytest.raises(ValueError, match=r"grad_ys\[1\]: expected shape \[5, 1\]"):
        core.linear_heads_bwd_input(Ws, [dev(normal(rng, 5, 9)), dev(normal(rng, 4, 1))], [1, 1])
    with pytest.raises(ValueError, match=r"grad_ys\[1\]: expected shape \[5, width >= 1\]"):
        core.linear_heads_bwd_params(h, [dev(normal(rng, 5, 9)), dev(normal(rng, 4, 1))])
    with pytest.raises(ValueError, match=r"grad_ys: expected 2 arrays, got 1"):
        core.linear_heads_bwd_input(Ws, [dev(normal(rng, 5, 9))], [1.0, 1.0])
    wide = [dev(normal(rng, 256, 300)), dev(normal(rng, 256, 213))]
    with pytest.raises(ValueError, match=r"Ws: expected widths adding up to at most 512"):
        core.linear_heads_fwd(h, wide, [dev(normal(rng, 300)), dev(normal(rng, 213))])
    with pytest.raises(ValueError, match=r"weights: expected 2 numbers, got 1"):
        core.linear_heads_bwd_input(Ws, [dev(normal(rng, 5, 9)), dev(normal(rng, 5, 1))], [1.0])


# --------------------------------------------------------------------------- AdamW
@pytest.mark.parametrize("n", (*SIZES, 256 * 256))
def test_adamw_three_steps(core: CudaOps, rng: np.random.Generator, n: int) -> None:
    shape = (n // 256, 256) if n % 256 == 0 else (n,)
    param = normal(rng, *shape)
    m, v = np.zeros_like(param), np.zeros_like(param)
    step, ok = np.zeros(1, dtype=np.int64), flag(1)
    d_param, d_m, d_v, d_step, d_ok = dev(param), dev(m), dev(v), dev(step), dev(ok)
    for _ in range(3):
        grad = normal(rng, *shape)
        scale = np.array([rng.uniform(0.2, 1.0)])
        npo.advance_counter(step, ok)
        npo.adamw_step(param, grad, m, v, step, grad_scale=scale, ok=ok, **HP)
        core.advance_counter(d_step, d_ok)
        core.adamw_step(d_param, dev(grad), d_m, d_v, d_step, grad_scale=dev(scale), ok=d_ok, **HP)
        assert same_bytes(d_step, step)
        assert_close(d_m, m)
        assert_close(d_v, v)
        assert_close(d_param, param)


def test_adamw_device_hyperparameters(core: CudaOps, rng: np.random.Generator) -> None:
    """Hyper-parameters as float64 device scalars (graph-safe) give the same bits as numbers."""
    grad, scale = dev(normal(rng, 999)), dev(np.array([0.5]))
    step, ok = dev(np.array([2])), dev(flag(1))
    start = [normal(rng, 999), np.abs(normal(rng, 999)) * np.float32(0.1), normal(rng, 999) ** 2]
    by_number = [dev(a) for a in start]
    by_device = [dev(a) for a in start]
    core.adamw_step(*by_number[:1], grad, *by_number[1:], step, grad_scale=scale, ok=ok, **HP)
    hp = {k: cupy.asarray(np.array([v])) for k, v in HP.items()}
    core.adamw_step(*by_device[:1], grad, *by_device[1:], step, grad_scale=scale, ok=ok, **hp)
    for a, b in zip(by_number, by_device, strict=True):
        assert same_bytes(a, b)


@pytest.mark.parametrize("count", (1, 14, 21))  # 21: two launches of at most 16 tensors
def test_adamw_steps_equal_one_launch_per_tensor(
    core: CudaOps, rng: np.random.Generator, count: int
) -> None:
    """adamw_steps / advance_counters (one launch per 16 tensors, per-tensor step counters,
    weight decays and gradient scales) write the bytes of adamw_step / advance_counter tensor by
    tensor, eagerly and inside a captured graph (where the gradients' and scales' address tables
    are written on the device)."""
    from service.backend.cuda.capture import CapturedCalls

    sizes = [int(rng.integers(1, 5000)) for _ in range(count)]
    sizes[0] = 0 if count > 1 else sizes[0]  # an empty tensor is skipped
    start = [[normal(rng, n), normal(rng, n), np.abs(normal(rng, n))] for n in sizes]
    grads = [dev(normal(rng, n)) for n in sizes]
    decays = [cupy.asarray(np.array([rng.uniform(0, 0.1)])) for _ in sizes]
    coefficients = dev(rng.uniform(0.1, 1.0, 3))  # three clip groups
    scales = [coefficients[i % 3 : i % 3 + 1] for i in range(count)]
    ok = dev(flag(1))
    hp = {k: cupy.asarray(np.array([v])) for k, v in HP.items() if k != "weight_decay"}
    one = [[dev(a) for a in s] for s in start]
    many = [[dev(a) for a in s] for s in start]
    steps_one = [dev(np.array([i % 3])) for i in range(count)]
    steps_many = [dev(np.array([i % 3])) for i in range(count)]
    stream = cupy.cuda.Stream(non_blocking=True)
    calls = CapturedCalls(stream)

    def fused() -> None:
        core.advance_counters(steps_many, ok)
        core.adamw_steps(
            [t[0] for t in many], grads, [t[1] for t in many], [t[2] for t in many],
            steps_many, weight_decays=decays, grad_scales=scales, ok=ok, **hp,
        )  # fmt: skip

    with stream:
        for _ in range(3):  # eager, captured, replayed
            each = zip(one, grads, steps_one, decays, scales, strict=True)
            for (p, m, v), g, step, wd, scale in each:
                core.advance_counter(step, ok)
                core.adamw_step(p, g, m, v, step, weight_decay=wd, grad_scale=scale, ok=ok, **hp)
            calls.run("adamw", fused)
            for a, b in zip(steps_one, steps_many, strict=True):
                assert same_bytes(a, b)
            for a, b in zip(one, many, strict=True):
                assert all(same_bytes(x, y) for x, y in zip(a, b, strict=True))
    assert calls.captures == 1


def test_ok_zero_leaves_every_byte(core: CudaOps, rng: np.random.Generator) -> None:
    """The non-finite guard as data: ok = 0 changes nothing, whatever the inputs."""
    param, m, v = normal(rng, 4099), normal(rng, 4099), np.abs(normal(rng, 4099))
    before = [param.copy(), m.copy(), v.copy()]
    d = [dev(param), dev(m), dev(v)]
    grad = normal(rng, 4099)
    grad[5] = np.nan
    step, off = dev(np.array([7])), dev(flag(0))
    nan_scale = dev(np.array([np.nan]))
    core.adamw_step(d[0], dev(grad), d[1], d[2], step, grad_scale=nan_scale, ok=off, **HP)
    for got, want in zip(d, before, strict=True):
        assert same_bytes(got, want)
    core.advance_counter(step, off)
    assert same_bytes(step, np.array([7]))
    target, online = normal(rng, 4099), normal(rng, 4099)
    d_target = dev(target)
    for tau in (0.0, 0.005):
        core.target_refresh([d_target], [dev(online)], dev(np.array([8])), 4, tau, off)
        assert same_bytes(d_target, target)


# --------------------------------------------------------------------------- clipping
NORM_SIZES = (1, 7, 2047, 2048, 2049, 4099 * 37, 256 * 256, 4099)


def test_global_norm(core: CudaOps, rng: np.random.Generator) -> None:
    grads = [normal(rng, n) * np.float32(rng.uniform(0.01, 10)) for n in NORM_SIZES]
    norm = core.global_norm([dev(g) for g in grads])
    assert_close(norm, npo.global_norm(grads))
    many = grads * 3  # 24 tensors: two multi-tensor launches into one partials buffer
    assert_close(core.global_norm([dev(g) for g in many]), npo.global_norm(many))
    assert_close(core.global_norm([dev(grads[3])]), npo.global_norm([grads[3]]))
    assert same_bytes(core.global_norm([]), npo.global_norm([]))


@pytest.mark.parametrize("layout", ((3, 2, 3), (1,), (8, 0, 16), (1, 1, 1, 1, 1, 1, 1, 1)))
def test_group_norms(core: CudaOps, rng: np.random.Generator, layout: tuple[int, ...]) -> None:
    """Each group's norm as the NumPy twin's; the last entry has global_norm's very bits, eagerly
    and replayed from a captured graph."""
    from service.backend.cuda.capture import CapturedCalls

    sizes = [int(rng.choice(NORM_SIZES)) for _ in range(sum(layout))]
    grads = [normal(rng, n) * np.float32(rng.uniform(0.01, 10)) for n in sizes]
    d_grads = [dev(g) for g in grads]
    want = npo.group_norms(grads, layout)
    stream = cupy.cuda.Stream(non_blocking=True)
    calls = CapturedCalls(stream)
    with stream:
        for _ in range(3):  # eager, captured, replayed
            norms = calls.run("norms", lambda: core.group_norms(d_grads, layout))
            assert norms.shape == (len(layout) + 1,)
            assert_close(norms, want)
            assert same_bytes(norms[-1:], core.global_norm(d_grads))
    with pytest.raises(ValueError, match="group_sizes"):
        core.group_norms(d_grads, (*layout, 1))


@pytest.mark.parametrize("max_norm", (0.5, 1.0, 40.0))
def test_clip_coefficient(core: CudaOps, max_norm: float) -> None:
    norms = np.array([0.0, 1e-9, 0.5, 1.0, 3.0, 1e6, np.inf, np.nan])
    for value in norms:
        norm = np.array([value])
        np.testing.assert_array_equal(
            host(core.clip_coefficient(dev(norm), max_norm)), npo.clip_coefficient(norm, max_norm)
        )
    np.testing.assert_array_equal(
        host(core.clip_coefficient(dev(norms), max_norm)), npo.clip_coefficient(norms, max_norm)
    )


@pytest.mark.parametrize("bad", (np.nan, np.inf, -np.inf))
def test_all_finite(core: CudaOps, rng: np.random.Generator, bad: float) -> None:
    arrays = [normal(rng, n) for n in NORM_SIZES] + [np.array([1.5]), np.zeros(0, np.float32)]
    assert same_bytes(core.all_finite([dev(a) for a in arrays]), flag(1))
    for which in range(len(arrays) - 1):
        for index in sorted({0, arrays[which].size // 2, arrays[which].size - 1}):
            spoiled = [a.copy() for a in arrays]
            spoiled[which][index] = bad
            assert same_bytes(core.all_finite([dev(a) for a in spoiled]), flag(0)), (which, index)
    assert same_bytes(core.all_finite([]), npo.all_finite([]))
    assert same_bytes(core.all_finite([dev(np.arange(5))]), flag(1))


@pytest.mark.parametrize("bad", (np.nan, np.inf))
def test_all_finite_many_small_arrays(core: CudaOps, rng: np.random.Generator, bad: float) -> None:
    """More small arrays (scalars, float32 and float64; up to 1,024 elements) than the final
    kernel checks itself: the rest go through the chunk pass; a bad value anywhere is seen."""
    arrays = [normal(rng, 1) if i % 3 else np.array([rng.normal()]) for i in range(10)]
    arrays += [normal(rng, 1024), normal(rng, 1025), np.array(rng.normal(), np.float32)]
    assert same_bytes(core.all_finite([dev(a) for a in arrays]), flag(1))
    for which in range(len(arrays)):
        spoiled = [a.copy() for a in arrays]
        spoiled[which].reshape(-1)[-1] = bad
        assert same_bytes(core.all_finite([dev(a) for a in spoiled]), flag(0)), which


# --------------------------------------------------------------------------- target refresh
@pytest.mark.parametrize(("tau", "updates"), [(0.005, 3), (0.0, 8), (0.0, 9)])
def test_target_refresh(core: CudaOps, rng: np.random.Generator, tau: float, updates: int) -> None:
    sizes = (1, 4099, 256 * 37, *rng.integers(0, 3000, 17))  # 20 tensors: two launches
    target = [normal(rng, n) for n in sizes]
    online = [normal(rng, n) for n in sizes]
    d_target = [dev(t) for t in target]
    count, ok = np.array([updates]), flag(1)
    core.target_refresh(d_target, [dev(o) for o in online], dev(count), 4, tau, dev(ok))
    npo.target_refresh(target, online, count, 4, tau, ok)
    for got, want in zip(d_target, target, strict=True):
        assert_close(got, want)


# --------------------------------------------------------------------------- Step statistics
def test_step_stats_accumulate(core: CudaOps, rng: np.random.Generator) -> None:
    """The device totals equal the twin's, bit for bit, over applied and skipped updates with
    absent statistics and non-finite losses; the first update resets what was there."""
    totals, want = cupy.full(17, np.nan), np.full(17, np.nan)
    for update in range(40):
        values = [np.float32(v) for v in normal(rng, 10) * np.float32(10)]
        values[5] = np.float64(abs(rng.normal()))  # the global norm
        for i in rng.choice(10, size=int(rng.integers(0, 4)), replace=False):
            values[i] = None
        if update % 7 == 3:
            values[int(rng.integers(0, 5))] = np.float32(rng.choice([np.nan, np.inf]))
        ok = flag(int(update % 5 != 0 and all(v is None or np.isfinite(v) for v in values)))
        device = [None if v is None else cupy.asarray(np.array([v])).reshape(()) for v in values]
        core.step_stats_accumulate(totals, device, dev(ok), update == 0)
        npo.step_stats_accumulate(want, values, ok, update == 0)
    assert same_bytes(totals, want)
    assert want[10] > 0 and want[11] > 0 and want[12:].sum() > 0  # both kinds, some flags


# --------------------------------------------------------------------------- GAE
@pytest.mark.parametrize("T", (1, 7, 33))
@pytest.mark.parametrize("N", SIZES)
@pytest.mark.parametrize("flag_dtype", (np.uint8, np.bool_))
def test_gae(core: CudaOps, rng: np.random.Generator, T: int, N: int, flag_dtype: type) -> None:
    rewards, values, next_values = normal(rng, T, N), normal(rng, T, N), normal(rng, T, N)
    terminated = (rng.random((T, N)) < 0.1).astype(flag_dtype)
    truncated = (rng.random((T, N)) < 0.05).astype(flag_dtype)
    args = (rewards, values, next_values, terminated, truncated)
    want_adv, want_ret = npo.gae(*args, 0.99, 0.95)
    got_adv, got_ret = core.gae(*(dev(a) for a in args), 0.99, 0.95)
    assert_close(got_adv, want_adv)
    assert_close(got_ret, want_ret)


# --------------------------------------------------------------------------- determinism
def test_same_inputs_same_bits(core: CudaOps, rng: np.random.Generator) -> None:
    x = dev(normal(rng, 300_001, 3))
    h = dev(normal(rng, 4099, 256))
    grads = [dev(normal(rng, n)) for n in NORM_SIZES]
    flags = dev((rng.random((33, 4099)) < 0.1).astype(np.uint8))
    rollout = [dev(normal(rng, 33, 4099)) for _ in range(3)]
    heads = [dev(normal(rng, 4099, 9)), dev(normal(rng, 4099, 1))]
    runs: list[Callable[[], object]] = [
        lambda: core.reduce_axis0(x),
        lambda: core.reduce_axis0(h),
        lambda: core.global_norm(grads),
        lambda: core.grad_h_stack(h, h, 0.3),
        lambda: core.linear_heads_bwd_params(h, heads)[0][0],
        lambda: core.gae(*rollout, flags, flags, 0.99, 0.95)[0],
        lambda: core.linear_bwd_params(h, h)[0],
    ]
    for run in runs:
        first, second = run(), run()
        assert same_bytes(first, second)

    start = normal(rng, 4099)

    def adamw_once() -> cupy.ndarray:
        param, m, v = (dev(a) for a in (start,) * 3)
        step, ok, scale = dev(np.array([1])), dev(flag(1)), dev(np.array([0.9]))
        core.adamw_step(param, grads[-1], m, cupy.abs(v), step, grad_scale=scale, ok=ok, **HP)
        return param

    assert same_bytes(adamw_once(), adamw_once())


# --------------------------------------------------------------------------- validation
def bad_calls(core: CudaOps) -> list[tuple[str, Callable[[], object]]]:
    f32 = cupy.zeros((7, 256), dtype=cupy.float32)
    f64 = cupy.zeros((7, 256), dtype=cupy.float64)
    b = cupy.zeros(256, dtype=cupy.float32)
    one = cupy.zeros(1, dtype=cupy.float32)
    step, ok = cupy.zeros(1, cupy.int64), cupy.ones(1, cupy.uint8)
    scale = cupy.ones(1, cupy.float64)
    tn = cupy.zeros((3, 7), dtype=cupy.float32)
    fl = cupy.zeros((3, 7), dtype=cupy.uint8)

    def adamw(**changes: object) -> None:
        args: dict[str, object] = {
            "param": one,
            "grad": one,
            "exp_avg": one,
            "exp_avg_sq": one,
            "step": step,
            **HP,
            "grad_scale": scale,
            "ok": ok,
        }
        core.adamw_step(**{**args, **changes})  # type: ignore[arg-type]

    return [
        ("z", lambda: core.bias_relu_fwd(f64, b)),
        ("z", lambda: core.bias_relu_fwd(cupy.zeros((7, 255), cupy.float32), b)),
        ("b", lambda: core.bias_relu_fwd(f32, b[:255])),
        ("z", lambda: core.bias_relu_fwd(cupy.zeros((256, 512), cupy.float32)[:, ::2], b)),
        ("grad_h", lambda: core.bias_relu_bwd(f32, f32[:6])),
        (
            "z",
            lambda: core.bias_relu_fwd(
                cupy.zeros(7 * 256 + 1, cupy.float32)[1:].reshape(7, 256), b
            ),
        ),
        ("x", lambda: core.reduce_axis0(f64)),
        ("x", lambda: core.reduce_axis0(np.zeros((3, 3), np.float32))),
        ("bottom", lambda: core.grad_h_stack(f32, tn, 1.0)),
        ("top", lambda: core.grad_h_stack(f64, f32, 1.0)),
        ("weight", lambda: core.grad_h_stack(f32, f32, one)),
        ("grad", lambda: adamw(grad=f32)),
        ("exp_avg_sq", lambda: adamw(exp_avg_sq=one.astype(cupy.float64))),
        ("step", lambda: adamw(step=one)),
        ("ok", lambda: adamw(ok=scale)),
        ("lr", lambda: adamw(lr="fast")),
        ("grad_scale", lambda: adamw(grad_scale=one)),
        ("counter", lambda: core.advance_counter(cupy.zeros(1, cupy.int32), ok)),
        ("counters", lambda: core.advance_counters([step, cupy.zeros(1, cupy.int64), step], ok)),
        ("grads[0]", lambda: core.global_norm([f64])),
        ("norm", lambda: core.clip_coefficient(one, 1.0)),
        ("norm", lambda: core.clip_coefficient(cupy.ones((2, 2), cupy.float64), 1.0)),
        ("group_sizes[1]", lambda: core.group_norms([f32, f32], (1, -1, 2))),
        ("grads[1]", lambda: core.group_norms([f32, f64], (2,))),
        ("arrays[0]", lambda: core.all_finite([cupy.zeros(3, cupy.float16)])),
        ("online[0]", lambda: core.target_refresh([f32], [f32[:3]], step, 4, 0.0, ok)),
        ("period", lambda: core.target_refresh([f32], [f32], step, 0, 0.0, ok)),
        ("terminated", lambda: core.gae(tn, tn, tn, fl[:, :6], fl, 0.99, 0.95)),
        ("values", lambda: core.gae(tn, tn.astype(cupy.float64), tn, fl, fl, 0.99, 0.95)),
        ("W", lambda: core.linear_fwd(f32, cupy.zeros((255, 3), cupy.float32), b[:3])),
    ]


def test_bad_arguments_name_the_argument(core: CudaOps) -> None:
    for name, call in bad_calls(core):
        with pytest.raises(ValueError, match=f"^{re.escape(name)}:"):
            call()


# --------------------------------------------------------------------------- loader cache
def test_kernel_disk_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled once into TRIDENT_KERNEL_CACHE, then read from disk; a corrupt cubin is rebuilt."""
    kernel_cache = tmp_path / "cache"
    monkeypatch.setenv(loader.CACHE_DIR_ENV, str(kernel_cache))
    defines = CudaDims(D=3, H=5, A=7, Z=11, K=13).defines()
    loader.clear_loaded()  # start from nothing in process
    load_kernel("encoder.cu", "bias_relu_fwd", defines)
    cubins = sorted(kernel_cache.glob("*.cubin"))
    assert cubins, "nothing written to the kernel cache"

    def files() -> dict[Path, tuple[int, int]]:
        return {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in cubins}

    written = files()
    loader.clear_loaded()
    load_kernel("encoder.cu", "bias_relu_fwd", defines)
    # A compile would have replaced the file (written atomically: a new inode).
    assert files() == written, "recompiled although the cache holds the kernel"

    for path in cubins:
        path.write_bytes(b"corrupt")
    loader.clear_loaded()
    kernel = load_kernel("encoder.cu", "bias_relu_fwd", defines)
    assert all(path.read_bytes() != b"corrupt" for path in cubins), "a corrupt entry was loaded"
    z, b = cupy.ones((2, 5), cupy.float32), cupy.ones(5, cupy.float32)
    h = cupy.empty_like(z)
    kernel((1,), (256,), (z, b, h, np.int32(2)))
    assert same_bytes(h, np.full((2, 5), 2.0, np.float32))
