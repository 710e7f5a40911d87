"""train.precision on the GPU: the cuBLAS GEMMs on tensor cores ('tf32', 'bf16': inputs
rounded, fp32 accumulation) are close to fp32 and not equal to it, give the same bytes run
after run and inside a CUDA graph; whole Steps at each precision stay near the fp32 NumPy
trainer and are deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_steps, small_config

from service.trainer.trainer import Trainer

from .test_trainer_cuda import GPU_SIZES, relative_error

# Relative error of one GEMM with K = 256 (unit-normal inputs) against fp64: TF32 keeps 10
# mantissa bits, bf16 7.
BOUND = {"tf32": 2e-3, "bf16": 2e-2}


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
    results = random_steps(fast, seed, 10)
    random_steps(again, seed, 10)
    reference = random_steps(cpu, seed, 10)
    assert fast.param_digest() == again.param_digest()  # deterministic
    for got, want in zip(results, reference, strict=True):
        assert got.updates_applied == want.updates_applied and not got.skipped
        for head, loss in want.losses.items():
            assert got.losses[head] == pytest.approx(loss, rel=5e-2, abs=5e-3), head
    worst = max(relative_error(fast.state_dict()[name], cpu.state_dict()[name])
                for name in cpu.state_dict() if name.startswith("params/"))  # fmt: skip
    assert worst < 5e-2, worst
