"""The whole op set on CuPy: the core ops and the head ops behind one object."""

from __future__ import annotations

from service.backend.cuda.core_ops import CoreOps
from service.backend.cuda.head_ops import HeadOps
from service.backend.cuda.loader import CudaDims


class CudaOps(CoreOps, HeadOps):
    """Every op of `service.backend.OP_NAMES`, kernels compiled for `dims`."""

    def __init__(self, dims: CudaDims) -> None:
        CoreOps.__init__(self, dims)
        HeadOps.__init__(self, dims)
        self.__name__ = f"{type(self).__module__}.CudaOps"
