"""bench/kernels/gemm_tf32x3.cu (3xTF32 tensor-core GEMMs and their fused epilogues, the
experiment of bench/gemm.py) against float64 NumPy (the twins matmul, bias_relu_fwd after
matmul, bias_relu_bwd after linear_bwd_input), on both tile heights, both layouts and the edges
of every tile.

Error measure: max |gpu - float64| / max Σ_k |a_ik||b_kj| (a bound cancellation cannot shrink),
below 1e-5 as every kernel's; plain TF32 would miss it by an order of magnitude. Inputs are
fresh random draws; the seed is printed and can be pinned with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="no CUDA device visible to CuPy (cupy is not installed)")

from service.backend import numpy_ops as npo  # noqa: E402
from service.backend.cuda.capture import CapturedCalls  # noqa: E402
from service.backend.cuda.gemm import gemm  # noqa: E402

from .conftest import TOL, dev, host, normal, same_bytes  # noqa: E402

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "tensor_core_gemm.py"
_spec = importlib.util.spec_from_file_location("tensor_core_gemm", _BENCH)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
tensor_core_gemm = _module.tensor_core_gemm

# (M, K, N): one row; primes off every tile edge; K below one k-step, one not a multiple of 4;
# the trainer's shapes (D = 40, H = 256, A·Z = 459) at B = 4096.
SHAPES = [
    (1, 40, 256),
    (7, 37, 29),
    (65, 1, 3),
    (129, 17, 131),
    (255, 256, 256),
    (1000, 16, 459),
    (4099, 256, 37),
    (8192, 40, 256),
    (8192, 256, 256),
    (4096, 256, 459),
]


def error_ratio(got: cupy.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64
    bound = float(np.max(np.abs(a64) @ np.abs(b64), initial=0.0))
    got_h = host(got)
    assert got_h.shape == want.shape and got_h.dtype == np.float32
    assert np.all(np.isfinite(got_h)), "non-finite output"
    return float(np.max(np.abs(got_h - want), initial=0.0)) / max(bound, 1e-30)


@pytest.mark.parametrize("tile_m", (64, 128))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_nn_and_nt_against_float64(
    rng: np.random.Generator, shape: tuple[int, int, int], tile_m: int
) -> None:
    M, K, N = shape
    a, b = normal(rng, M, K), normal(rng, K, N)
    nn = error_ratio(tensor_core_gemm(dev(a), dev(b), False, tile_m=tile_m), a, b)
    bt = np.ascontiguousarray(b.T)
    nt = error_ratio(tensor_core_gemm(dev(a), dev(bt), True, tile_m=tile_m), a, b)
    print(f"{shape}: error / bound nn {nn:.2e}, nt {nt:.2e}")
    assert nn < TOL and nt < TOL


@pytest.mark.parametrize("shape", [(255, 256, 256), (4096, 256, 459), (7, 37, 29)])
def test_gemm_has_float32_accuracy_not_tf32s(
    rng: np.random.Generator, shape: tuple[int, int, int]
) -> None:
    """Within 2e-6 of the bound (cuBLAS SGEMM, printed beside it, lands near 1e-7); one TF32
    pass keeps 11 significand bits, an error of order 2^-11 / sqrt(K) of the bound."""
    M, K, N = shape
    a, b = normal(rng, M, K), normal(rng, K, N)
    ours = error_ratio(tensor_core_gemm(dev(a), dev(b), False), a, b)
    sgemm = error_ratio(gemm(dev(a), dev(b)), a, b)
    print(f"{shape}: error / bound tf32x3 {ours:.2e}, cuBLAS SGEMM {sgemm:.2e}")
    assert ours < 2e-6


@pytest.mark.parametrize("tile_m", (64, 128))
@pytest.mark.parametrize("shape", [(1, 40, 256), (129, 37, 131), (8192, 256, 256)])
def test_fused_epilogues_match_their_twins(
    rng: np.random.Generator, shape: tuple[int, int, int], tile_m: int
) -> None:
    M, K, N = shape
    x, W, bias = normal(rng, M, K), normal(rng, K, N), normal(rng, N)
    got = host(tensor_core_gemm(dev(x), dev(W), False, "bias_relu", dev(bias), tile_m))
    x64, W64 = x.astype(np.float64), W.astype(np.float64)
    want = npo.bias_relu_fwd(npo.matmul(x64, W64), bias.astype(np.float64))
    bound = float(np.max(np.abs(x) @ np.abs(W) + np.abs(bias)))
    assert np.max(np.abs(got - want)) / bound < TOL
    assert np.all(got >= 0)
    # Back through a layer x W (W [K, N] as the layer's weights) and the ReLU that made x.
    g, h = normal(rng, M, N), np.maximum(normal(rng, M, K), 0)
    got = host(tensor_core_gemm(dev(g), dev(W), True, "relu_gate", dev(h), tile_m))
    want = npo.bias_relu_bwd(h, npo.linear_bwd_input(W64, g.astype(np.float64)))
    bound = float(np.max(np.abs(g) @ np.abs(W.T)))
    assert np.max(np.abs(got - want)) / bound < TOL
    assert np.all(got[h == 0] == 0)


def test_misaligned_and_narrow_rows_take_the_4_byte_path(rng: np.random.Generator) -> None:
    """Arrays starting off a 16-byte boundary, and rows not a multiple of 4 floats, load one
    float at a time; the result is the aligned one's."""
    M, K, N = 300, 64, 256
    a, b = normal(rng, M, K), normal(rng, K, N)
    buffer = cupy.empty(M * K + 1, dtype=cupy.float32)
    shifted = buffer[1:].reshape(M, K)
    shifted[...] = dev(a)
    assert shifted.data.ptr % 16 and shifted.flags.c_contiguous
    aligned = tensor_core_gemm(dev(a), dev(b), False)
    assert same_bytes(tensor_core_gemm(shifted, dev(b), False), aligned)
    assert error_ratio(aligned, a, b) < TOL


def test_same_bytes_run_after_run_and_in_a_replayed_graph(rng: np.random.Generator) -> None:
    x, W, bias = dev(normal(rng, 4099, 256)), dev(normal(rng, 256, 256)), dev(normal(rng, 256))
    g, h = dev(normal(rng, 4099, 256)), dev(np.maximum(normal(rng, 4099, 256), 0))

    def calls() -> list[cupy.ndarray]:
        return [
            tensor_core_gemm(x, W, False),
            tensor_core_gemm(x, W, False, "bias_relu", bias),
            tensor_core_gemm(g, W, True, "relu_gate", h),
        ]

    first, second = calls(), calls()
    assert all(same_bytes(p, q) for p, q in zip(first, second, strict=True))
    stream = cupy.cuda.Stream(non_blocking=True)
    captured = CapturedCalls(stream)
    with stream:
        for _ in range(3):  # eager, captured (and launched), replayed
            replayed = captured.run("gemms", calls)
            assert all(same_bytes(p, q) for p, q in zip(replayed, first, strict=True))
    assert captured.captures == 1


def test_non_finite_inputs_give_non_finite_outputs(rng: np.random.Generator) -> None:
    a, b = normal(rng, 40, 37), normal(rng, 37, 29)
    a[3, 5], a[11, 0], a[20, 36] = np.inf, -np.inf, np.nan
    got = host(tensor_core_gemm(dev(a), dev(b), False))
    bad_rows = [3, 11, 20]
    assert not np.isfinite(got[bad_rows]).any()
    others = np.setdiff1d(np.arange(40), bad_rows)
    assert error_ratio(dev(got[others]), a[others], b) < TOL


def test_bad_arguments_name_the_argument() -> None:
    a, side = cupy.zeros((5, 4), cupy.float32), cupy.zeros((5, 3), cupy.float32)
    b_kn, b_nk = cupy.zeros((4, 3), cupy.float32), cupy.zeros((3, 4), cupy.float32)
    bias_f64 = cupy.zeros(3, cupy.float64)
    calls = [
        ("b", lambda: tensor_core_gemm(a, b_nk, False)),
        ("b", lambda: tensor_core_gemm(a, b_kn, True)),
        ("epilogue", lambda: tensor_core_gemm(a, b_nk, True, "bias_relu")),
        ("side", lambda: tensor_core_gemm(a, b_kn, False, "bias_relu")),
        ("side", lambda: tensor_core_gemm(a, b_nk, True, "relu_gate", side[:4])),
        ("tile_m", lambda: tensor_core_gemm(a, b_kn, False, tile_m=32)),
        ("a", lambda: tensor_core_gemm(a.astype(cupy.float64), b_kn, False)),
        ("b", lambda: tensor_core_gemm(a, cupy.zeros((3, 4), cupy.float32).T, False)),
        ("side", lambda: tensor_core_gemm(a, b_kn, False, "bias_relu", bias_f64)),
    ]
    for name, call in calls:
        with pytest.raises(ValueError, match=f"^{name}:"):
            call()
