"""The compiled host market (service/lobsim/compiled.py) steps LobSim's markets to the same
integer state, observations and rewards as the NumPy engine, byte for byte, in every flow
setting (tests/lobsim/test_kernel_on_host.py ties the NumPy engine to kernels/lobsim.cu)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fresh_seed

from service.config import LobsimConfig
from service.lobsim import compiled
from service.lobsim.env import NUM_ACTIONS, LobSim

pytestmark = pytest.mark.skipif(not compiled.available(), reason="Numba does not import")

BOOKS = ("base", "lots", "agent_px", "agent_qty", "agent_ahead", "inventory", "cash",
         "overflow", "traded")  # fmt: skip
MARKET = ("excitation", "direction", "t", "mid2", "truncated_lots", "variance", "flow_ema")


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
        {"cancel_weight": 0, "market_weight": 0, "events_per_step": 1, "latency_events": 0},
    ],
    ids=[
        "default",
        "hawkes-random-latency",
        "narrow-recentring",
        "informed-flipping",
        "limits-only",
    ],
)
def test_compiled_market_steps_as_numpy_engine(settings: dict) -> None:
    seed = fresh_seed()
    cfg = LobsimConfig(horizon=45, **settings)
    N = int(np.random.default_rng(seed).integers(1, 80))
    numpy_engine = LobSim(N, cfg, seed, engine="numpy")
    numba_engine = LobSim(N, cfg, seed, engine="numba")
    rng = np.random.default_rng(seed)
    for step in range(100):  # two episode ends: liquidation and reset
        actions = rng.integers(0, NUM_ACTIONS, N)
        want, got = numpy_engine.step(actions), numba_engine.step(actions)
        for name in BOOKS:
            a, b = getattr(numpy_engine.books, name), getattr(numba_engine.books, name)
            assert a.tobytes() == b.tobytes(), (step, name)
        for name in MARKET:
            a, b = getattr(numpy_engine, name), getattr(numba_engine, name)
            assert a.tobytes() == b.tobytes(), (step, name)
        assert want.obs.tobytes() == got.obs.tobytes(), step
        assert want.reward.tobytes() == got.reward.tobytes(), step
        for key in ("agent_taken", "agent_passive", "cash"):
            assert want.info[key].tobytes() == got.info[key].tobytes(), (step, key)
    books = numba_engine.books
    assert books.traded.sum() > 0


def test_compiled_market_state_dict_round_trip() -> None:
    """Markets of the compiled engine saved mid-episode and loaded into the NumPy engine (and
    back) step on as the ones that never stopped."""
    seed = fresh_seed()
    cfg = LobsimConfig(horizon=60, hawkes=True)
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, NUM_ACTIONS, (80, 24))
    straight = LobSim(24, cfg, seed, engine="numba")
    for a in actions[:30]:
        straight.step(a)
    moved = LobSim(24, cfg, seed, engine="numpy")
    moved.load_state_dict(straight.state_dict())
    for a in actions[30:]:
        want, got = straight.step(a), moved.step(a)
        assert want.obs.tobytes() == got.obs.tobytes()
    assert straight.books.lots.tobytes() == moved.books.lots.tobytes()


def test_engine_is_checked() -> None:
    with pytest.raises(ValueError, match="engine"):
        LobSim(2, LobsimConfig(), 0, engine="fortran")
