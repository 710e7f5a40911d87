"""A warning when the C51 support does not fit the returns.

The categorical projection clips Tz = r + γⁿ z to [v_min, v_max]; the Step reports the share of
target mass that fell outside (`c51_support_clip_ratio`). A few percent is the tails; a high
share for several Steps means the Q head learns a distribution piled on the support's ends, and
its gradient then teaches the encoder little. The fix is a setting, so the warning names it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from service.config import C51Config

WINDOW = 10  # Steps with a Q update whose clip ratios are averaged
THRESHOLD = 0.05  # mean share of clipped target mass that triggers the warning
COOLDOWN = 100  # Steps between two warnings


class SupportWatch:
    """Feed it each Step's clip ratio; it answers a warning, at most once per COOLDOWN Steps."""

    def __init__(self, c51: C51Config) -> None:
        self.v_min, self.v_max = c51.v_min, c51.v_max
        self.ratios: deque[float] = deque(maxlen=WINDOW)
        self.quiet_until = 0

    def observe(
        self, step: int, ratio: float, returns: Callable[[], tuple[float, float]] | None
    ) -> str | None:
        """`ratio` of Step `step` (one that updated the Q head); `returns`: the (mean, std) of
        the returns seen, when known, asked only for a warning, to suggest a support. A
        message, or None."""
        self.ratios.append(ratio)
        mean = sum(self.ratios) / len(self.ratios)
        if len(self.ratios) < WINDOW or mean < THRESHOLD or step < self.quiet_until:
            return None
        self.quiet_until = step + COOLDOWN
        advice = "widen c51.v_min / c51.v_max to cover the discounted returns"
        if returns is not None:
            mu, sigma = returns()
            low, high = math.floor(mu - 4 * sigma), math.ceil(mu + 4 * sigma)
            advice += (
                f" (returns seen: mean {mu:.3g}, std {sigma:.3g}; e.g. --set c51.v_min={low} "
                f"--set c51.v_max={high})"
            )
        return (
            f"c51: {100 * mean:.0f} % of the target distribution's mass fell outside the support "
            f"[{self.v_min:g}, {self.v_max:g}] over the last {WINDOW} Steps; {advice}"
        )
