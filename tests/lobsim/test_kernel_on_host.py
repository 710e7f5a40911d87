"""kernels/lobsim.cu, built for the host (tests/lobsim/host_kernel.py), steps LobSim's markets
to the same integer state as the NumPy engine, byte for byte, in every flow setting: the
kernel's market logic is checked here on every machine; tests/gpu/test_lobsim_cuda.py checks
the device build and the CuPy environment around it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import fresh_seed

from service.config import LobsimConfig
from service.lobsim.env import NUM_ACTIONS, LobSim

from .host_kernel import HostMarket, build, compiler

STATE = ("lots", "agent_px", "agent_qty", "agent_ahead", "inventory", "cash", "overflow", "traded")

pytestmark = pytest.mark.skipif(
    compiler() is None and os.environ.get("CI") != "true",
    reason="no C++ compiler (CI=true makes this a failure)",
)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"hawkes": True, "random_latency": True, "latency_events": 5, "max_order_lots": 9},
        {
            "price_levels": 24,
            "visible_levels": 4,
            "initial_depth": 11,
            "cancel_weight": 9,
            "recentre_ticks": 2,
            "market_size": 3,
        },
        {
            "informed_pct": 40,
            "informed_flip_permille": 300,
            "hawkes": True,
            "random_latency": True,
            "latency_events": 5,
        },
    ],
    ids=["default", "hawkes-random-latency", "narrow-recentring", "informed-flipping"],
)
def test_host_built_kernel_steps_markets_as_numpy_does(settings: dict, tmp_path: Path) -> None:
    seed = fresh_seed()
    cfg = LobsimConfig(horizon=45, **settings)
    N = 67
    lib = build(cfg.price_levels, cfg.visible_levels, tmp_path)
    numpy_engine = LobSim(N, cfg, seed, engine="numpy")
    kernel = LobSim(N, cfg, seed, market=HostMarket(lib, numpy_engine.key))
    rng = np.random.default_rng(seed)
    for step in range(100):  # two episode ends: liquidation and reset
        actions = rng.integers(0, NUM_ACTIONS, N)
        want, got = numpy_engine.step(actions), kernel.step(actions)
        for name in (*STATE, "base"):
            a, b = getattr(numpy_engine.books, name), getattr(kernel.books, name)
            assert a.tobytes() == b.tobytes(), (step, name)
        for name in ("excitation", "direction", "t", "mid2", "truncated_lots"):
            assert getattr(numpy_engine, name).tobytes() == getattr(kernel, name).tobytes(), step
        assert want.obs.tobytes() == got.obs.tobytes(), step
        assert want.reward.tobytes() == got.reward.tobytes(), step
    books = numpy_engine.books
    assert books.traded.sum() > 0 and (books.agent_px >= 0).any() and books.agent_qty.sum() > 0
