"""The whole op set on CuPy: one mixin per kernel concern, composed into `CudaOps`."""

from __future__ import annotations

from service.backend.cuda.act import ActOps
from service.backend.cuda.c51 import C51Ops
from service.backend.cuda.encoder import EncoderOps
from service.backend.cuda.gae import GaeOps
from service.backend.cuda.grad_norm_clip import GradNormClipOps
from service.backend.cuda.linear import LinearOps
from service.backend.cuda.linear_heads import LinearHeadsOps
from service.backend.cuda.loader import CudaDims
from service.backend.cuda.optim import OptimOps
from service.backend.cuda.perception import PerceptionOps
from service.backend.cuda.ppo import PpoOps
from service.backend.cuda.replay import ReplayOps
from service.backend.cuda.step_stats import StepStatsOps
from service.backend.cuda.value import ValueOps

__all__ = ["CudaOps"]


class CudaOps(
    LinearOps,
    LinearHeadsOps,
    EncoderOps,
    C51Ops,
    PpoOps,
    ValueOps,
    PerceptionOps,
    GaeOps,
    GradNormClipOps,
    OptimOps,
    StepStatsOps,
    ActOps,
    ReplayOps,
):
    """Every op of `service.backend.opset.OpSet`, kernels compiled for the `CudaDims` given
    (`CudaOps(dims, precision)`: the cuBLAS GEMMs' train.precision); the multi-tensor ops share
    one cache of address tables and layouts."""

    def __init__(self, dims: CudaDims, precision: str = "fp32") -> None:
        super().__init__(dims)
        self.precision = precision
