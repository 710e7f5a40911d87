"""LobSim environments (service/lobsim/env.py): invariants over long random-action runs, the
message stream against the scalar reference engine, determinism, actions and episodes."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from conftest import fresh_seed

from service.config import LobsimConfig
from service.lobsim.book import AGENT, ASK, BID, BUY, LIMIT, Books, Fills, Messages
from service.lobsim.env import NUM_ACTIONS, LobSim, feature_column, observation_dim
from service.lobsim.reference import ReferenceMarket
from tests.lobsim.test_book import check_invariants, merged, of_env


class Recorder:
    """Wraps `books.apply` to keep every call's messages and fills."""

    def __init__(self, books: Books) -> None:
        self.calls: list[tuple[Messages, Fills]] = []
        self.books, self._apply = books, books.apply
        books.apply = self  # type: ignore[method-assign]

    def detach(self) -> None:
        """Give the books their own `apply` back."""
        del self.books.apply

    def __call__(self, messages: Messages, seq: int) -> Fills:
        fills = self._apply(messages, seq)
        self.calls.append((messages, fills))
        return fills

    def take(self) -> list[tuple[Messages, Fills]]:
        calls, self.calls = self.calls, []
        return calls


# CI runs 1,600 steps (4 episodes: resets and liquidations included); the long run is
# `make long` (TRIDENT_LOBSIM_STEPS=10000).
INVARIANT_STEPS = int(os.environ.get("TRIDENT_LOBSIM_STEPS") or 1_600)


@pytest.mark.slow
def test_invariants_over_random_steps_on_64_markets() -> None:
    check_random_run(LobsimConfig(horizon=400), INVARIANT_STEPS)


def check_random_run(cfg: LobsimConfig, steps: int, num_envs: int = 64) -> None:
    """`steps` uniformly random actions on fresh markets: the book invariants after every
    step, the agent's account equal to the signed sum of its fills, lots traded counted."""
    env = LobSim(num_envs, cfg, seed=fresh_seed(), engine="numpy")  # books.apply recorded
    recorder = Recorder(env.books)
    rng = np.random.default_rng(fresh_seed())
    books = env.books
    inventory, cash = books.inventory.copy(), books.cash.copy()
    traded = books.traded.copy()
    agent_lots = 0
    started = time.perf_counter()
    for _ in range(steps):
        base = books.base.copy()  # the step's fills are priced before any re-centring
        out = env.step(rng.integers(0, NUM_ACTIONS, num_envs))
        check_invariants(books)
        assert np.isfinite(out.obs).all() and np.isfinite(out.reward).all()
        for _messages, fills in recorder.take():
            lots = np.bincount(fills.env, weights=fills.qty, minlength=num_envs)
            traded += lots.astype(np.int64)
            for who, sign in ((fills.aggressor, fills.side), (fills.resting, -fills.side)):
                agent = who == AGENT
                agent_lots += int(fills.qty[agent].sum())
                signed = sign[agent] * fills.qty[agent]
                np.add.at(inventory, fills.env[agent], signed)
                price = base[fills.env[agent]] + fills.price[agent]
                np.add.at(cash, fills.env[agent], -signed * price)
        # Shares and cash conserved: the agent's account is the signed sum of its fills
        # (an ended episode is liquidated and reset, its account starts again at zero).
        live = ~out.terminated
        assert (books.inventory[live] == inventory[live]).all()
        assert (books.cash[live] == cash[live]).all()
        inventory[~live], cash[~live] = 0, 0
        assert (books.traded == traded).all()
    elapsed = time.perf_counter() - started
    print(f"{num_envs * steps:,} env steps in {elapsed:.1f} s; agent lots {agent_lots}; "
          f"overflow {books.overflow.sum()}; traded {books.traded.sum()}")  # fmt: skip
    assert agent_lots > 0 and books.traded.sum() > 0


def mirror_initial_books(env: LobSim) -> list[ReferenceMarket]:
    """Reference markets holding the env's initial books (one background LIMIT per level)."""
    markets = []
    for n in range(env.num_envs):
        market = ReferenceMarket(env.cfg.price_levels, int(env.books.base[n]))
        for side, books_side in ((BUY, BID), (-BUY, ASK)):
            for p in np.flatnonzero(env.books.lots[books_side, n]):
                lots = int(env.books.lots[books_side, n, p])
                assert not market.apply(LIMIT, side, 0, int(p), lots, 0, seq=-1)
        markets.append(market)
    return markets


def test_env_message_stream_equals_reference_engine() -> None:
    """Every message the env sends (background flow and the agent's orders) applied to
    scalar reference markets gives the same fills (stream hash) and the same books."""
    cfg = LobsimConfig(horizon=10_000, random_latency=True, recentre_ticks=0)  # messages only
    env = LobSim(32, cfg, seed=fresh_seed(), engine="numpy")  # books.apply recorded
    markets = mirror_initial_books(env)
    recorder = Recorder(env.books)
    rng = np.random.default_rng(fresh_seed())
    got_hash = [hashlib.sha256() for _ in markets]
    want_hash = [hashlib.sha256() for _ in markets]
    for _ in range(250):
        env.step(rng.integers(0, NUM_ACTIONS, env.num_envs))
        for messages, fills in recorder.take():
            for n, market in enumerate(markets):
                fields = ("kind", "side", "owner", "price", "qty", "position")
                message = [int(getattr(messages, f)[n]) for f in fields]
                seq = int(fills.seq[0]) if fills.seq.size else 0
                want = [row[1:] for row in merged(market.apply(*message, seq=seq))]
                got = [row[1:] for row in of_env(fills, n)]
                assert got == want
                got_hash[n].update(repr(got).encode())
                want_hash[n].update(repr(want).encode())
    for n, market in enumerate(markets):
        assert got_hash[n].digest() == want_hash[n].digest()
        assert env.books.lots[BID, n].tolist() == market.bid_totals()
        assert env.books.lots[ASK, n].tolist() == market.ask_totals()
        assert (int(env.books.inventory[n]), int(env.books.cash[n])) == (
            market.inventory,
            market.cash,
        )


def trajectory_digest(seed: int, steps: int = 120) -> str:
    env = LobSim(16, LobsimConfig(horizon=50), seed=seed)
    rng = np.random.default_rng(7)
    digest = hashlib.sha256()
    for _ in range(steps):
        out = env.step(rng.integers(0, NUM_ACTIONS, 16))
        for array in (out.obs, out.reward, env.books.lots, env.books.agent_px, env.books.cash):
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def test_same_seed_same_trajectory() -> None:
    seed = fresh_seed()
    assert trajectory_digest(seed) == trajectory_digest(seed)
    assert trajectory_digest(seed) != trajectory_digest(seed + 1)


def test_observation_shape_and_episode_end() -> None:
    cfg = LobsimConfig(horizon=5)
    env = LobSim(8, cfg, seed=fresh_seed())
    assert env.reset().shape == (8, observation_dim(cfg))
    for step in range(1, 6):
        out = env.step(np.full(8, 7))  # market buys: an inventory to liquidate
        assert out.terminated.all() == (step == 5)
    assert "final_obs" in out.info and out.info["final_obs"].shape == out.obs.shape
    assert np.isfinite(out.info["episode_return"]).all()
    assert (env.books.inventory == 0).all() and (env.t == 0).all()
    time_left = feature_column(cfg, "time_left")
    assert (out.obs[:, time_left] == 1.0).all()
    assert (out.info["final_obs"][:, time_left] == 0.0).all()


def test_quote_keeps_priority_until_its_price_changes() -> None:
    """HOLD and a repeated quote at unchanged prices send nothing: each resting quote keeps
    its place (lots ahead of it only shrink). A re-sent order would go to the back."""
    env = LobSim(
        16, LobsimConfig(latency_events=0, horizon=1000), seed=fresh_seed(), engine="numpy"
    )  # books.apply recorded
    env.step(np.full(16, 2))  # QUOTE(0, 0)
    assert (env.books.agent_px >= 0).any()
    for action in (0, 2, 0, 2):
        px, ahead = env.books.agent_px.copy(), env.books.agent_ahead.copy()
        recorder = Recorder(env.books)
        env.step(np.full(16, action))
        calls = recorder.take()
        recorder.detach()
        agent_sent = np.zeros(16, dtype=bool)
        for messages, _ in calls:
            agent_sent |= (messages.owner == AGENT) & (messages.kind != 0)
        kept = (env.books.agent_px == px) & (px >= 0)
        assert (env.books.agent_ahead[kept] <= ahead[kept]).all()
        if action == 0:
            assert not agent_sent.any()


@pytest.mark.parametrize(("action", "limit"), [(7, 1), (8, -1)])
def test_market_orders_masked_at_the_inventory_limit(action: int, limit: int) -> None:
    cfg = LobsimConfig(max_inventory=3, horizon=1000)
    env = LobSim(4, cfg, seed=2, engine="numpy")  # books.apply recorded
    env.books.inventory[:] = limit * cfg.max_inventory
    assert not env.action_mask()[:, action].any()
    recorder = Recorder(env.books)
    env.step(np.full(4, action))
    agent_taker = [f.aggressor == AGENT for _, f in recorder.take()]
    assert not any(a.any() for a in agent_taker)


def market_orders_per_step(hawkes: bool, seed: int) -> np.ndarray:
    cfg = LobsimConfig(horizon=10_000, hawkes=hawkes, market_weight=20)
    env = LobSim(64, cfg, seed=seed, engine="numpy")  # books.apply recorded
    recorder = Recorder(env.books)
    counts = []
    for _ in range(150):
        env.step(np.zeros(64, dtype=np.int64))  # HOLD: only background messages
        markets = sum((m.kind == 3) & (m.owner == 0) for m, _ in recorder.take())
        counts.append(markets)
    return np.stack(counts).astype(np.float64)  # [steps, envs]


def test_hawkes_flow_clusters_market_orders() -> None:
    """Self-excitation makes market orders per step over-dispersed (variance / mean above the
    plain flow's), and more frequent."""
    seed = fresh_seed()
    plain, hawkes = market_orders_per_step(False, seed), market_orders_per_step(True, seed)
    fano = lambda c: float(np.mean(c.var(axis=0) / np.maximum(c.mean(axis=0), 1e-9)))  # noqa: E731
    print(f"Fano factor: plain {fano(plain):.2f}, hawkes {fano(hawkes):.2f}")
    assert fano(hawkes) > 1.3 * fano(plain)  # measured: 1.55-1.60 against 0.96-0.98
    assert hawkes.mean() > plain.mean()


def test_window_recentres_on_a_drifting_mid() -> None:
    """Market buys push the price up; the window follows the mid, books and accounts keep their
    absolute prices, and lots shifted past the edge are counted."""
    cfg = LobsimConfig(price_levels=24, visible_levels=4, initial_depth=4, recentre_ticks=3,
                       max_inventory=10_000, market_size=4, horizon=10_000)  # fmt: skip
    env = LobSim(8, cfg, seed=fresh_seed())
    mid = env.books.base + env.mid2 / 2.0  # absolute ticks
    for _ in range(60):
        books = env.books
        absolute = {
            side: {int(env.books.base[n]) + p: int(books.lots[side, n, p])
                   for n in range(1) for p in np.flatnonzero(books.lots[side, n])}
            for side in (BID, ASK)
        }  # fmt: skip
        shifted_before = env.books.base.copy()
        env.mid2 = env.mid2 + 2 * (cfg.recentre_ticks + 1)  # pretend the mid moved up
        value = books.cash + books.inventory * (books.base + env.mid2 / 2.0)
        drift = env.mid2 // 2 - cfg.price_levels // 2
        expected = np.where(np.abs(drift) > cfg.recentre_ticks, drift, 0)
        held = books.lots.sum(axis=(0, 2)) + books.agent_qty.sum(axis=0)
        truncated = env.truncated_lots.copy()
        env.recentre()
        # every lot either moved with the window or was counted as truncated
        held_after = env.books.lots.sum(axis=(0, 2)) + env.books.agent_qty.sum(axis=0)
        assert (held - held_after == env.truncated_lots - truncated).all()
        assert ((env.books.base - shifted_before) == expected).all()
        assert (np.abs(env.mid2 // 2 - cfg.price_levels // 2) <= cfg.recentre_ticks).all()
        after = {
            side: {int(env.books.base[n]) + p: int(books.lots[side, n, p])
                   for n in range(1) for p in np.flatnonzero(books.lots[side, n])}
            for side in (BID, ASK)
        }  # fmt: skip
        kept = {s: {k: v for k, v in absolute[s].items() if k in after[s]} for s in absolute}
        assert kept == after  # every surviving lot kept its absolute price
        assert np.allclose(books.cash + books.inventory * (books.base + env.mid2 / 2.0), value)
        env.step(np.full(8, 7))  # market buys: the real drift
        check_invariants(env.books)
    # The buys lift the price on average (by 4.9 to 11 ticks over 150 seeds); a single market's
    # background flow can absorb them and its window come back where it started.
    assert (env.books.base + env.mid2 / 2.0).mean() > mid.mean() + 2


def test_markets_loaded_from_a_state_go_on_as_the_markets_it_came_from() -> None:
    """state_dict after some steps, loaded into fresh markets of the same seed: the two step
    alike from there, across an episode's end; a state that does not fit changes nothing and
    names what is wrong."""
    seed = fresh_seed()
    cfg = LobsimConfig(horizon=30)
    first, second = LobSim(16, cfg, seed), LobSim(16, cfg, seed)
    rng = np.random.default_rng(seed)
    for _ in range(13):
        first.step(rng.integers(0, NUM_ACTIONS, 16))
    state = first.state_dict()
    untouched = second.state_dict()
    other = LobSim(16, cfg, seed + 1).state_dict()
    for bad, field in (
        ({**state, "market/key": other["market/key"]}, "market/key"),
        ({k: v for k, v in state.items() if k != "books/cash"}, "expected the arrays"),
        ({**state, "market/t": state["market/t"][:3]}, "market/t"),
        ({**state, "market/variance": state["market/variance"].astype(np.float32)},
         "market/variance"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            second.load_state_dict(bad)
        assert all(np.array_equal(v, second.state_dict()[k]) for k, v in untouched.items())
    second.load_state_dict(state)
    for step in range(40):
        actions = rng.integers(0, NUM_ACTIONS, 16)
        want, got = first.step(actions), second.step(actions)
        assert want.obs.tobytes() == got.obs.tobytes(), step
        assert want.reward.tobytes() == got.reward.tobytes(), step
