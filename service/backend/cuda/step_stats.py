"""A Step's statistics on CuPy (kernels/step_stats.cu): each update's losses, norm and
counts added on the device, so a Step reads the device once."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.backend.cuda.launch import Array, KernelOps
from service.backend.cuda.validate import F32 as _F32
from service.backend.cuda.validate import F64 as _F64
from service.backend.cuda.validate import array as _array
from service.backend.cuda.validate import flag as _flag
from service.backend.cuda.validate import one as _one

__all__ = ["StepStatsOps"]

STEP_STATS, STEP_NORM = 10, 5  # step_stats.cu: statistics per update, the float64 one


class StepStatsOps(KernelOps):
    """step_stats_accumulate."""

    def step_stats_accumulate(
        self, totals: Array, values: Sequence[Array | None], ok: Array, first: bool
    ) -> None:
        """One update's statistics into a Step's totals, in place, zeroed first by the Step's
        `first` update (step_stats.cu)."""
        totals = _array("totals", totals, _F64, shape=(STEP_STATS + 7,))
        if len(values) != STEP_STATS:
            raise ValueError(f"values: expected {STEP_STATS} statistics, got {len(values)}")
        addresses = []
        for i, value in enumerate(values):
            dtypes = _F64 if i == STEP_NORM else _F32
            addresses.append(
                np.uint64(0 if value is None else _one(f"values[{i}]", value, dtypes).data.ptr)
            )
        self._kernel("step_stats.cu", "step_stats_accumulate")(
            (1,), (1,), (totals, _flag("ok", ok), *addresses, np.int32(bool(first)))
        )
