"""bench/soak.py's RSS line (`rss_drift`) on made-up series: a flat working set whose memory is
handed back for a few seconds at a time reads flat, wherever the hand-backs fall; a working set
that grows reads its growth."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from bench.soak import Settings, rss_drift

SETTINGS = Settings(duration_s=40.0, warmup_frac=0.5, replay_capacity=1)
MIB = 2**20


Series = list[tuple[float, int, float]]


def series(mib_at: Callable[[float], float], rng: np.random.Generator) -> Series:
    """Samples every 0.1 s (jittered) of `mib_at(t)` MiB, the replay full from the start."""
    times = np.arange(0.0, SETTINGS.duration_s, 0.1) + rng.uniform(0, 0.05)
    return [(float(t), int(mib_at(t) * MIB), 1e6) for t in times]


@pytest.mark.parametrize("seed", range(8))
def test_a_flat_working_set_with_long_hand_backs_reads_flat(seed: int) -> None:
    rng = np.random.default_rng([seed, 1])
    period, length = rng.uniform(12, 16), rng.uniform(3.5, 4.5)  # the EPYC's: ~15 s, 3.5-4 s
    phase = rng.uniform(0, period)
    plateau = 82.0 + rng.uniform(-1, 1)
    drift = rss_drift(series(lambda t: plateau - 11.3 * (((t + phase) % period) < length), rng),
                      SETTINGS)  # fmt: skip
    assert abs(drift["change_pct"]) < 0.5, drift


@pytest.mark.parametrize("seed", range(4))
def test_a_growing_working_set_reads_its_growth(seed: int) -> None:
    rng = np.random.default_rng([seed, 2])
    grow = rng.uniform(2.5, 5.0)  # MiB over the 20 s measured: 3-6 % of 82 MiB
    period = rng.uniform(10, 16)
    drift = rss_drift(series(lambda t: 82.0 + grow * max(t - 20, 0) / 20
                             - 11.3 * ((t % period) < 3.0), rng), SETTINGS)  # fmt: skip
    want = 100 * grow / 82.0
    assert drift["change_pct"] == pytest.approx(want, rel=0.25), drift
    assert drift["change_pct"] > 2.0  # the CI soak's bound (tests/reliability/test_soak.py)
