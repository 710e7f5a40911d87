"""LobSim on the device (kernels/lobsim.cu + the environment in CuPy) against NumPy: one seed,
one action stream, the same integer state byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fresh_seed

from service.backend.philox import Stream, random_bits, seed_key
from service.config import LobsimConfig
from service.lobsim.env import NUM_ACTIONS, LobSim

STATE = ("lots", "agent_px", "agent_qty", "agent_ahead", "inventory", "cash", "overflow", "traded")


def run_both(settings: dict, steps: int, horizon: int) -> LobSim:
    """The same seed and actions on NumPy and on the device for `steps` steps, checked after
    every step; returns the NumPy markets."""
    seed = fresh_seed()
    cfg = LobsimConfig(horizon=horizon, **settings)
    N = 257  # not a multiple of the block size
    cpu, gpu = LobSim(N, cfg, seed), LobSim(N, cfg, seed, backend="cuda")
    rng = np.random.default_rng(seed)
    import cupy

    host = cupy.asnumpy
    for step in range(steps):
        actions = rng.integers(0, NUM_ACTIONS, N)
        want, got = cpu.step(actions), gpu.step(actions)
        for name in (*STATE, "base"):
            a, b = getattr(cpu.books, name), host(getattr(gpu.books, name))
            assert a.tobytes() == b.tobytes(), (step, name)
        for name in ("excitation", "direction", "t", "mid2", "truncated_lots"):
            assert getattr(cpu, name).tobytes() == host(getattr(gpu, name)).tobytes(), step
        assert np.array_equal(want.terminated, host(got.terminated)), step
        # floats: the same formulas, but CuPy may contract a multiply-add into one rounding
        np.testing.assert_allclose(host(got.obs), want.obs, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(host(got.reward), want.reward, rtol=1e-6, atol=1e-6)
    assert cpu.books.traded.sum() > 0 and (cpu.books.agent_px >= 0).any()
    return cpu


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"hawkes": True, "random_latency": True, "latency_events": 5},
        {"price_levels": 24, "visible_levels": 4, "initial_depth": 11, "cancel_weight": 9,
         "recentre_ticks": 0},
        {"price_levels": 24, "visible_levels": 4, "recentre_ticks": 2, "market_size": 3},
    ],
    ids=["default", "hawkes-random-latency", "narrow-window", "recentring"],
)
def test_cpu_and_gpu_markets_are_bit_identical(settings: dict) -> None:
    cpu = run_both(settings, steps=60, horizon=25)  # two episode ends: liquidation and reset
    if cpu.cfg.recentre_ticks == 2:
        assert (cpu.books.base != cpu.books.base[0]).any() or cpu.truncated_lots.any()


@pytest.mark.parametrize(
    "settings",
    [
        {"informed_pct": 100},
        {"informed_pct": 40, "informed_flip_permille": 300, "hawkes": True,
         "random_latency": True, "latency_events": 5},
        {"informed_pct": 70, "informed_flip_permille": 50, "price_levels": 24,
         "visible_levels": 4, "recentre_ticks": 2},
    ],
    ids=["all-informed", "flipping-hawkes-random-latency", "informed-recentring"],
)
def test_informed_flow_cpu_and_gpu_markets_are_bit_identical(settings: dict) -> None:
    """Informed flow: the hidden direction (reset draws, flips) and the steered market orders
    alike on both engines over 300 steps (three episode ends)."""
    cpu = run_both(settings, steps=300, horizon=90)
    assert ((cpu.direction == 1) | (cpu.direction == -1)).all()


@pytest.mark.parametrize("stream", [Stream.LOB_RESET, Stream.LOB_LATENCY, Stream.LOB_INFORMED])
def test_device_random_bits_are_the_host_philox_words(
    stream: Stream, rng: np.random.Generator
) -> None:
    from service.lobsim.cuda_market import CudaMarket  # imports CuPy, so only where it runs

    seed = int(rng.integers(1 << 31))
    cfg = LobsimConfig()
    env = LobSim(8, cfg, seed, backend="cuda")
    market = CudaMarket(env.books, cfg.visible_levels, seed_key(seed))
    for sequence in (0, int(rng.integers(1 << 32)), int(rng.integers(1 << 32, 1 << 62))):
        n = int(rng.integers(1, 5000))
        got = market.random_bits(stream, sequence, n).get()
        np.testing.assert_array_equal(got, random_bits(seed_key(seed), stream, sequence, n))


def test_device_markets_loaded_from_a_state_go_on_as_the_markets_it_came_from() -> None:
    """A resumed job's markets: state_dict of device markets after some steps, loaded into
    fresh device markets of the same seed, which then step exactly as the first ones, across
    an episode's end (the host copy of the state reads every device array)."""
    import cupy

    seed = fresh_seed()
    cfg = LobsimConfig(horizon=30)
    N = 257
    first, second = LobSim(N, cfg, seed, backend="cuda"), LobSim(N, cfg, seed, backend="cuda")
    rng = np.random.default_rng(seed)
    for _ in range(17):
        first.step(rng.integers(0, NUM_ACTIONS, N))
    state = first.state_dict()
    assert all(isinstance(array, np.ndarray) for array in state.values())
    second.load_state_dict(state)
    for step in range(40):
        actions = rng.integers(0, NUM_ACTIONS, N)
        want, got = first.step(actions), second.step(actions)
        assert cupy.asnumpy(want.obs).tobytes() == cupy.asnumpy(got.obs).tobytes(), step
        assert cupy.asnumpy(want.reward).tobytes() == cupy.asnumpy(got.reward).tobytes(), step
    for name, array in first.state_dict().items():
        assert array.tobytes() == second.state_dict()[name].tobytes(), name
