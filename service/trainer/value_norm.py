"""Running return statistics for the value head (value normalisation, as in MAPPO's ValueNorm).

The value head predicts v̂ = (V − μ) / σ, where μ and σ² are exponential moving averages of the
GAE returns' mean and mean square over Steps, debiased like Adam's moments:

    a ← β a + (1 − β) mean(R),   b ← β b + (1 − β) mean(R²),   c ← β c + (1 − β)
    μ = a / c,   σ² = max(b / c − μ², σ²_min)

So the value loss and its gradients stay O(1) whatever the reward scale: a return of −100
does not make the value head's gradient dwarf the policy's. GAE and Act's values use the
denormalised V = σ v̂ + μ. The statistics are three float64 numbers on the backend's device,
saved in checkpoints. A Step folds its returns into a proposal (`updated`), normalises its
targets with it, and `commit`s it on the device only if one of its updates was applied: a Step
that changes no parameter changes nothing Act reads.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from service.backend.comm import Communicator

VARIANCE_FLOOR = 1e-2  # σ ≥ 0.1 return units: a constant return does not blow up v̂


class ValueNorm:
    """μ and σ of the returns; `enabled=False` makes every method the identity."""

    def __init__(self, xp: ModuleType, dtype: np.dtype, decay: float, enabled: bool) -> None:
        self.xp, self.dtype, self.decay, self.enabled = xp, np.dtype(dtype), decay, enabled
        # [a, b, c]: the moving averages of mean(R), mean(R²) and of 1 (the debiasing term);
        # c = 0 means no Step yet: μ = 0, σ = 1 until the first update.
        self.stats = xp.zeros(3, dtype=np.float64)

    def updated(self, returns: np.ndarray, comm: Communicator | None = None) -> np.ndarray:
        """The statistics with one Step's returns [any shape] folded in (a new device array;
        `stats` itself is unchanged until `commit`). With a communicator (data-parallel
        ranks), the means are over every rank's returns."""
        if not self.enabled:
            return self.stats
        xp, beta = self.xp, self.decay
        flat = returns.reshape(-1).astype(np.float64)
        step = xp.empty(3, dtype=np.float64)
        if comm is None:
            step[0:1] = flat.mean(keepdims=True)
            step[1:2] = (flat * flat).mean(keepdims=True)
        else:  # sums and the count over every rank's returns
            sums = xp.empty(3, dtype=np.float64)
            sums[0:1], sums[1:2], sums[2:3] = flat.sum(), (flat * flat).sum(), flat.size
            comm.all_reduce_sum(sums)
            step[0:2] = sums[0:2] / sums[2]
        step[2:3] = 1.0
        return beta * self.stats + (1.0 - beta) * step

    def commit(self, proposed: np.ndarray, ok: np.ndarray) -> None:
        """stats ← proposed where the bool [1] `ok` holds, on the device (nothing read back)."""
        if self.enabled:
            self.stats[...] = self.xp.where(ok, proposed, self.stats)

    def normalize(self, values: np.ndarray, stats: np.ndarray | None = None) -> np.ndarray:
        """(V − μ) / σ in the trainer's dtype, under `stats` (default: the committed ones)."""
        if not self.enabled:
            return values
        mean, std = _moments(self.xp, self.stats if stats is None else stats)
        return ((values - mean) / std).astype(self.dtype)

    def denormalize(self, outputs: np.ndarray) -> np.ndarray:
        """σ v̂ + μ in the trainer's dtype."""
        if not self.enabled:
            return outputs
        mean, std = _moments(self.xp, self.stats)
        return (outputs * std + mean).astype(self.dtype)


def moments(stats: np.ndarray) -> tuple[float, float]:
    """(μ, σ) of a host copy of ValueNorm.stats (the Step reads them back with its statistics)."""
    mean, std = _moments(np, np.asarray(stats, dtype=np.float64))
    return float(mean[0]), float(std[0])


def _moments(xp: ModuleType, stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(μ, σ) as float64 [1] arrays of the statistics [a, b, c] (μ = 0, σ = 1 while c = 0)."""
    a, b, c = stats[0:1], stats[1:2], stats[2:3]
    seen = c > 0
    c = xp.where(seen, c, 1.0)
    mean = xp.where(seen, a / c, 0.0)
    var = xp.where(seen, xp.maximum(b / c - mean * mean, VARIANCE_FLOOR), 1.0)
    return mean, xp.sqrt(var)
