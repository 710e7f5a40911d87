"""train.precision on the GPU: the cuBLAS GEMMs on tensor cores ('tf32': inputs rounded to
TF32 by cuBLAS; 'bf16': operands rounded to bfloat16 by kernels/bf16.cu; fp32 accumulation) are
close to fp32 and not equal to it or to each other, give the same bytes run after run and
inside a CUDA graph; whole Steps at each precision stay near the fp32 NumPy trainer and are
deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_steps, small_config

from service.trainer.trainer import Trainer

from .test_trainer_cuda import GPU_SIZES, relative_error

# Relative error of one GEMM with K = 256 (unit-normal inputs) against fp64: TF32 keeps 10
# mantissa bits, bf16 7.
BOUND = {"tf32": 2e-3, "bf16": 2e-2}
# Over STEPS Steps: each Step's losses within LOSS (relative, absolute) of fp32's, and the
# parameters' displacement from the common start within DRIFT of fp32's, as a share of it.
# Adam's per-element normalisation lets rounding steer small gradients, so the drift grows
# with the Steps: tf32 on the H200 (3 seeds) drifted 0.0015-0.012 after 3 Steps and
# 0.031-0.047 after 10; bf16 rounds each operand 8 times coarser. The GEMMs themselves are
# held to their exact bounds above; this checks the precision's wiring through whole Steps.
STEPS = 3
LOSS = {"tf32": (5e-2, 5e-3), "bf16": (1e-1, 1e-2)}
DRIFT = {"tf32": 0.1, "bf16": 0.5}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """NumPy's rounding of float32 to bfloat16 bits (nearest, ties to even; NaN kept quiet)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_round_to_bf16_matches_numpy_bit_for_bit(rng: np.random.Generator) -> None:
    import cupy

    from service.backend.cuda.gemm import round_to_bf16

    scales = 10.0 ** rng.uniform(-40, 38, 4096)
    x = (rng.standard_normal(4096) * scales).astype(np.float32)
    ties = (rng.integers(0, 1 << 16, 512, dtype=np.uint32) << 16) | 0x8000  # exactly halfway
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4028235e38, 1e-45])
    x = np.concatenate([x, ties.view(np.float32), special.astype(np.float32)])
    x = x.reshape(-1, 8)  # 2 dims: a GEMM operand's shape
    got = round_to_bf16(cupy.asarray(x)).get()
    assert got.dtype == np.uint16 and got.shape == x.shape
    np.testing.assert_array_equal(got, bf16_bits(x))
    finite = np.isfinite(x) & (np.abs(x) < 3.3e38)
    values = bf16_values(got)[finite].astype(np.float64)
    # half a unit in bf16's 8th significant bit, or half its smallest subnormal (2^-133)
    assert np.all(np.abs(values - x[finite]) <= np.abs(x[finite]) * 2.0**-8 + 2.0**-134)


def test_bf16_gemm_multiplies_the_rounded_operands_in_fp32(rng: np.random.Generator) -> None:
    import cupy

    from service.backend.cuda.gemm import gemm

    a = rng.standard_normal((384, 256)).astype(np.float32)
    b = rng.standard_normal((256, 320)).astype(np.float32)
    # bf16 products are exact in fp32: what is left is the tensor cores' fp32 accumulation over
    # K = 256 (~1e-6), far below the bf16 rounding of the operands (~3e-3) it is checked for.
    exact = bf16_values(bf16_bits(a)).astype(np.float64) @ bf16_values(bf16_bits(b))
    got = gemm(cupy.asarray(a), cupy.asarray(b), precision="bf16").get()
    assert relative_error(got, exact) < 1e-4
    tf32 = gemm(cupy.asarray(a), cupy.asarray(b), precision="tf32").get()
    assert relative_error(tf32, exact) > 10 * relative_error(got, exact)  # not TF32's bytes


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_tensor_core_gemms_are_close_deterministic_and_capturable(
    precision: str, rng: np.random.Generator
) -> None:
    import cupy

    from service.backend.cuda.gemm import gemm

    a = rng.standard_normal((512, 256)).astype(np.float32)
    b = rng.standard_normal((256, 384)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    da, db = cupy.asarray(a), cupy.asarray(b)
    fast = gemm(da, db, precision=precision).get()
    assert relative_error(fast, exact) < BOUND[precision]
    assert not np.array_equal(fast, gemm(da, db).get())  # not the fp32 path
    assert gemm(da, db, precision=precision).get().tobytes() == fast.tobytes()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = gemm(da, db, trans_b=False, precision=precision)
        graph = stream.end_capture()
        graph.launch()
        stream.synchronize()
    assert out.get().tobytes() == fast.tobytes()


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_steps_at_each_precision_track_fp32_and_repeat_bytes(precision: str, seed: int) -> None:
    def trainer(backend: str, level: str) -> Trainer:
        return Trainer(small_config(*GPU_SIZES, f"train.backend={backend}",
                                    f"train.precision={level}"))  # fmt: skip

    fast, again = trainer("cuda", precision), trainer("cuda", precision)
    cpu = trainer("numpy", "fp32")
    start = flat_params(cpu)
    results = random_steps(fast, seed, STEPS)
    random_steps(again, seed, STEPS)
    reference = random_steps(cpu, seed, STEPS)
    assert fast.param_digest() == again.param_digest()  # deterministic
    for got, want in zip(results, reference, strict=True):
        assert got.updates_applied == want.updates_applied and not got.skipped
        for head, loss in want.losses.items():
            rel, tol = LOSS[precision]
            assert got.losses[head] == pytest.approx(loss, rel=rel, abs=tol), head
    moved = {name: flat_params(t) - start for name, t in (("fast", fast), ("cpu", cpu))}
    drift = relative_error(moved["fast"], moved["cpu"])
    assert drift < DRIFT[precision], drift


def flat_params(trainer: Trainer) -> np.ndarray:
    """Every parameter tensor of `trainer`, in float64, one vector."""
    state = trainer.state_dict()
    return np.concatenate(
        [state[k].astype(np.float64).ravel() for k in state if k.startswith("params/")]
    )
