"""kernels/lobsim.cu against the NumPy market: one seed, one action stream, the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import LobsimConfig
from service.lobsim.env import NUM_ACTIONS, LobSim

STATE = ("lots", "agent_px", "agent_qty", "agent_ahead", "inventory", "cash", "overflow", "traded")


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"hawkes": True, "random_latency": True, "latency_events": 5},
        {"price_levels": 24, "visible_levels": 4, "initial_depth": 11, "cancel_weight": 9},
    ],
    ids=["default", "hawkes-random-latency", "narrow-window"],
)
def test_cpu_and_gpu_markets_are_bit_identical(settings: dict) -> None:
    seed = int(np.random.default_rng().integers(2**32))
    print(f"seed {seed}")
    cfg = LobsimConfig(horizon=25, **settings)
    N = 257  # not a multiple of the block size
    cpu, gpu = LobSim(N, cfg, seed), LobSim(N, cfg, seed, backend="cuda")
    rng = np.random.default_rng(seed)
    for step in range(60):  # two episode ends: liquidation and reset on both
        actions = rng.integers(0, NUM_ACTIONS, N)
        want, got = cpu.step(actions), gpu.step(actions)
        for name in STATE:
            a, b = getattr(cpu.books, name), getattr(gpu.books, name)
            assert np.array_equal(a, b), (step, name)
        assert np.array_equal(cpu.excitation, gpu.excitation), step
        assert want.obs.tobytes() == got.obs.tobytes(), step
        assert want.reward.tobytes() == got.reward.tobytes(), step
    assert cpu.books.traded.sum() > 0 and (cpu.books.agent_px >= 0).any()
