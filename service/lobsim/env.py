"""LobSim: N market-making environments on the vectorised books (NumPy).

One `step(actions)` is one agent decision per env followed by `events_per_step` background
events (`flow.py`). With `lobsim.hawkes`, each market order adds `hawkes_jump` to its env's
market weight and the addition decays by `hawkes_decay_pct` % per event (clustered flow). With
`lobsim.informed_pct` > 0 each market has a hidden direction d = ±1, drawn at reset and flipped
with probability `informed_flip_permille` ‰ at the start of each step, and each background
market order is informed with probability `informed_pct` % and then takes side d (SPEC.md,
"Informed flow"): signed flow predicts the next mid move. The agent's messages land after
`latency_events` background events (or a uniform random number in [0, latency_events] per env
and step). Every random draw is Philox, keyed by the seed, with the env index as the counter's
element: one seed gives one trajectory.

Actions (the agent's orders are `quote_size` lots; market orders `market_size` lots):
  0 HOLD          resting quotes stay, with their queue priority
  1 CANCEL_ALL    cancel both quotes
  2 QUOTE(0, 0)   bid at the best bid, ask at the best ask
  3 QUOTE(1, 1)   one tick behind each touch
  4 QUOTE(3, 3)   three ticks behind each touch
  5 QUOTE(0, 2)   bid at the touch, ask two ticks behind
  6 QUOTE(2, 0)   bid two ticks behind, ask at the touch
  7 MARKET_BUY    masked (becomes HOLD) at inventory >= max_inventory
  8 MARKET_SELL   masked at inventory <= -max_inventory
A quote's prices come from the book the agent observed; a side whose price is unchanged is
not re-sent, so it keeps its place in the queue.

Reward per step (ticks): Δ(cash + inventory·mid) − taker_fee·(lots the agent took)
+ maker_rebate·(lots of its resting orders filled) − damping·max(0, inventory·Δmid)
− inventory_penalty·inventory². After `horizon` steps the inventory is liquidated at the far
touch (a long sells at the best bid, a short buys at the best ask), the episode terminates and
the env resets; `step` then returns the new episode's first observation and puts the final one
in `info["final_obs"]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.backend.philox import Stream, below, random_bits, random_bits_span, seed_key
from service.config import LobsimConfig
from service.lobsim import compiled
from service.lobsim.book import (
    AGENT,
    ASK,
    BID,
    BUY,
    CANCEL,
    LIMIT,
    MARKET,
    SELL,
    Books,
    Messages,
)
from service.lobsim.flow import background_messages, limit_weights, scaled


class MarketKernel(Protocol):
    """Runs a step's market events over `Books` in place, kernels/lobsim.cu's contract: the
    CUDA backend's CudaMarket (service/lobsim/cuda_market.py), or that kernel built for the
    host (tests/lobsim/test_kernel_on_host.py). Returns the agent's taken and passive lots
    and the signed flow per market."""

    def step(
        self,
        books: Books,
        messages: list[Messages],
        latency: np.ndarray,
        weights: tuple[np.ndarray, np.ndarray, np.ndarray],
        excitation: np.ndarray,
        direction: np.ndarray,
        first_seq: int,
        events: int,
        flow_settings: tuple[int, bool, int, int, int, int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def random_bits(self, stream: Stream, sequence: int, n: int) -> np.ndarray:
        """Philox words [n, 4] uint32 of `sequence` in `stream` (philox.random_bits)."""
        ...


NUM_ACTIONS = 9
QUOTES = {2: (0, 0), 3: (1, 1), 4: (3, 3), 5: (0, 2), 6: (2, 0)}  # action: (bid, ask) ticks
BASE_PRICE = 10_000  # ticks of the window's centre at reset
LABEL_DIM = 3  # aux targets: next spread, next L1 imbalance, realised volatility


INVENTORY_SCALE = 4.0  # lots: the inventory features are q / 4, (q / 4)² and q / 4 × time left
# Weight of the older value in the observation's moving average of signed flow, per step: a
# memory of ~20 steps, long enough to show a direction informed flow holds for ~50.
FLOW_EMA_DECAY = 0.95
# The observation's scalars, after the 4 · visible_levels ladder columns (SPEC.md's table).
SCALAR_FEATURES = (
    "spread", "mid_change", "imbalance_l1", "imbalance_l5", "flow", "flow_ema", "volatility",
    "inventory", "inventory_sq", "inventory_time_left", "pnl", "time_left",
    "bid_quote_distance", "ask_quote_distance", "bid_queue_ahead", "ask_queue_ahead",
)  # fmt: skip


def observation_dim(cfg: LobsimConfig) -> int:
    """Levels (offset, size) per side, then the scalars (see `LobSim._observe`)."""
    return 4 * cfg.visible_levels + len(SCALAR_FEATURES)


def feature_column(cfg: LobsimConfig, name: str) -> int:
    """The observation column of scalar feature `name` (one of SCALAR_FEATURES)."""
    return 4 * cfg.visible_levels + SCALAR_FEATURES.index(name)


@dataclass
class StepOutput:
    obs: np.ndarray  # [N, obs_dim] float32
    reward: np.ndarray  # [N] float32
    terminated: np.ndarray  # [N] bool: the episode ended (and the env was reset)
    truncated: np.ndarray  # [N] bool: always False (episodes end by liquidation)
    info: dict


# What the markets' next steps depend on beyond the seed and the settings: the books' arrays,
# the markets' own, and the Philox sequence and the episode clock (`LobSim.state_dict`).
BOOK_STATE = ("base", "lots", "agent_px", "agent_qty", "agent_ahead", "inventory", "cash",
              "overflow", "traded")  # fmt: skip
MARKET_STATE = ("t", "mid2", "variance", "flow_ema", "limit_w", "cancel_w", "market_w",
                "excitation", "direction", "truncated_lots", "episode_return")  # fmt: skip


class LobSim:
    """N independent markets with one market-making agent each."""

    label_dim = LABEL_DIM  # perception labels per step: next mid move (BCE) and LABEL_DIM aux

    def __init__(
        self,
        num_envs: int,
        cfg: LobsimConfig,
        seed: int,
        backend: str = "numpy",
        market: MarketKernel | None = None,
        engine: str = "auto",
    ) -> None:
        """`market` runs each step's market events in place of the NumPy engine, over books
        on the backend (`backend="cuda"` makes its own: kernels/lobsim.cu on the GPU). On the
        host `engine` picks who runs them when `market` is None: "numba" (compiled.py, the
        kernel's loop compiled by Numba), "numpy" (`_events`, vectorised over the markets) or
        "auto" (numba where Numba imports); both give the same integer state."""
        if backend not in ("numpy", "cuda"):
            raise ValueError(f"backend: expected 'numpy' or 'cuda', got {backend!r}")
        if engine not in ("auto", "numba", "numpy"):
            raise ValueError(f"engine: expected 'auto', 'numba' or 'numpy', got {engine!r}")
        self.cfg, self.num_envs = cfg, num_envs
        self.key = seed_key(seed)
        if backend == "cuda":  # every array on the device; the market events in kernels/lobsim.cu
            import cupy as xp
        else:
            xp = np
        self.xp = xp
        self.books = Books(num_envs, cfg.price_levels, xp.full(num_envs, BASE_PRICE), xp)
        self.calls = 0  # Philox sequence: one per call that draws
        self.t = xp.zeros(num_envs, dtype=xp.int64)  # steps into the episode
        self.mid2 = xp.zeros(num_envs, dtype=xp.int64)  # 2 · mid, in ticks of the window
        self.variance = xp.zeros(num_envs)  # EMA of squared mid changes per step
        self.flow_ema = xp.zeros(num_envs)  # EMA of the observation's signed flow per step
        self.limit_w = xp.zeros((num_envs, cfg.visible_levels), dtype=xp.int64)
        self.cancel_w = xp.zeros(num_envs, dtype=xp.int64)
        self.market_w = xp.zeros(num_envs, dtype=xp.int64)
        self.excitation = xp.zeros(num_envs, dtype=xp.int64)  # hawkes: extra market weight
        # informed flow: the hidden direction, +1 (up) or -1; 0 while informed flow is off
        self.direction = xp.zeros(num_envs, dtype=xp.int64)
        self.truncated_lots = xp.zeros(num_envs, dtype=xp.int64)  # fell off a re-centred window
        self.episode_return = xp.zeros(num_envs)
        # Every market starts its episodes together and they all last `horizon` steps, so one
        # host clock says when they end: stepping never reads the device to decide a reset.
        self.clock = 0
        # Action tables on the backend once, so a step uploads nothing.
        self._quoting = xp.asarray([a in QUOTES for a in range(NUM_ACTIONS)])
        self._behind = xp.asarray(
            [QUOTES.get(a, (0, 0)) for a in range(NUM_ACTIONS)], dtype=xp.int64
        )
        self._limit_weights = xp.asarray(limit_weights(cfg))
        self._label_columns = xp.asarray(
            [feature_column(cfg, name) for name in ("spread", "imbalance_l1", "volatility")]
        )
        self._market = market
        if backend == "cuda" and market is None:
            from service.lobsim.cuda_market import CudaMarket

            self._market = CudaMarket(self.books, cfg.visible_levels, self.key)
        elif market is None and engine != "numpy" and (engine == "numba" or compiled.available()):
            self._market = compiled.CompiledMarket(self.key)
        self._reset()
        self._last_obs = self._observe(xp.zeros(num_envs), xp.zeros(num_envs))

    # ----------------------------------------------------------------------------- public
    def reset(self) -> np.ndarray:
        """The current observation (the envs reset themselves when an episode ends)."""
        return self._last_obs

    def action_mask(self) -> np.ndarray:
        """[N, 9] bool: market orders masked at the inventory limit."""
        xp = self.xp
        mask = xp.ones((self.num_envs, NUM_ACTIONS), dtype=bool)
        mask[:, 7] = self.books.inventory < self.cfg.max_inventory
        mask[:, 8] = self.books.inventory > -self.cfg.max_inventory
        return mask

    def step(self, actions: np.ndarray) -> StepOutput:
        """Apply one action per env, then the background events; auto-reset ended episodes."""
        xp = self.xp
        cfg, books = self.cfg, self.books
        if isinstance(actions, np.ndarray) or xp is np:
            host = np.asarray(actions)
            if ((host < 0) | (host >= NUM_ACTIONS)).any():
                raise ValueError(f"actions: expected integers in [0, {NUM_ACTIONS}), got {host}")
        # Device actions are not range-checked (that would read the device every step): one
        # outside [0, 9) is HOLD, as a masked market order is.
        actions = xp.asarray(actions, dtype=xp.int64).reshape(self.num_envs)
        allowed = xp.take_along_axis(
            self.action_mask(), xp.clip(actions, 0, NUM_ACTIONS - 1)[:, None], axis=1
        )[:, 0]
        actions = xp.where(allowed & (actions >= 0) & (actions < NUM_ACTIONS), actions, 0)
        value_before = books.cash + books.inventory * (books.base + self.mid2 / 2.0)
        inventory_before, mid_before = books.inventory.copy(), self.mid2.copy()
        agent_messages = self._agent_messages(actions)
        latency = self._latency()
        events = cfg.events_per_step
        first = self.calls  # the Philox sequences of this step's background events
        self.calls += events
        if self._market is not None:
            taken, passive, flow = self._market.step(
                books, agent_messages, latency, (self.limit_w, self.cancel_w, self.market_w),
                self.excitation, self.direction, first, events,
                (cfg.max_order_lots, cfg.hawkes, cfg.hawkes_jump, cfg.hawkes_decay_pct,
                 cfg.informed_pct, cfg.informed_flip_permille),
            )  # fmt: skip
        else:
            taken, passive, flow = self._events(agent_messages, latency, first)
        self.t += 1
        self.clock += 1
        mid2 = self._mid2()
        change = (mid2 - mid_before) / 2.0
        self.variance = 0.9 * self.variance + 0.1 * change * change
        self.mid2 = mid2
        if cfg.recentre_ticks:
            self.recentre()
        over = self.clock >= cfg.horizon
        done = xp.full(self.num_envs, over)
        if over:
            self._liquidate()
        value = books.cash + books.inventory * (books.base + self.mid2 / 2.0)
        reward = (
            value
            - value_before
            - cfg.taker_fee * taken
            + cfg.maker_rebate * passive
            - cfg.damping * xp.maximum(0.0, inventory_before * change)
            - cfg.inventory_penalty * inventory_before.astype(xp.float64) ** 2
        )
        self.episode_return += reward
        flow = flow / (cfg.events_per_step * cfg.max_order_lots)
        self.flow_ema = FLOW_EMA_DECAY * self.flow_ema + (1.0 - FLOW_EMA_DECAY) * flow
        obs = self._observe(change, flow)
        labels = self._labels(obs)
        info = {
            "bce_prev": change > 0,  # did the mid rise after obs_{t-1}
            "aux_prev": labels,
            "episode_return": xp.where(done, self.episode_return, np.nan),
            "overflow": books.overflow.copy(),  # orders priced outside the window (dropped)
            "truncated_lots": self.truncated_lots.copy(),  # lots lost by re-centring
            "inventory": books.inventory.copy(),  # after liquidation where the episode ended
            "agent_taken": taken,  # lots the agent's orders took from the book this step
            "agent_passive": passive,  # lots of the agent's resting quotes filled this step
            "pnl": value,  # cash + inventory · mid (ticks) at the end of the step, before a reset
            "cash": books.cash.copy(),  # ticks; after the liquidation where the episode ended
        }
        if over:
            info["final_obs"] = obs
            self.episode_return = xp.zeros(self.num_envs)
            self._reset()
            obs = self._observe(xp.zeros(self.num_envs), xp.zeros(self.num_envs))
        self._last_obs = obs
        return StepOutput(obs, reward.astype(xp.float32), done, xp.zeros_like(done), info)

    def _events(
        self, agent_messages: list[Messages], latency: np.ndarray, first: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The step's market events on the host: the agent's messages at their latency slot,
        background events in between. Returns the agent's taken and passive lots and the
        signed flow per env (kernels/lobsim.cu is the device twin)."""
        cfg, books, N = self.cfg, self.books, self.num_envs
        taken, passive = np.zeros(N, dtype=np.int64), np.zeros(N, dtype=np.int64)
        flow = np.zeros(N, dtype=np.int64)  # signed aggressor lots
        events = cfg.events_per_step
        bits = random_bits_span(self.key, Stream.LOB_FLOW, first, events, N)
        informed = self._informed_sides(first) if cfg.informed_pct else None
        for slot in range(events + 1):
            for message in agent_messages:
                landing = latency == slot
                if landing.any():
                    only = Messages(*(np.where(landing, m, 0) for m in _fields(message)))
                    self._account(books.apply(only, first + slot), taken, passive, flow)
            if slot < events:
                messages = background_messages(
                    books, bits[slot], self.limit_w, self.cancel_w,
                    self.market_w + self.excitation, cfg.max_order_lots,
                    None if informed is None else informed[slot],
                )  # fmt: skip
                self._account(books.apply(messages, first + slot), taken, passive, flow)
                if cfg.hawkes:  # each market order raises the market weight, which decays
                    self.excitation = self.excitation * cfg.hawkes_decay_pct // 100
                    self.excitation += cfg.hawkes_jump * (messages.kind == MARKET)
        return taken, passive, flow

    def _informed_sides(self, first: int) -> np.ndarray:
        """Informed flow of the step whose background events have Philox sequences first ..
        first + events - 1: flips the hidden direction (word 1 of the first event's
        LOB_INFORMED draw) and returns [events, N] the side each event's market order takes
        if it is informed (the direction), 0 if it is not (word 0 of the event's draw)."""
        cfg, N = self.cfg, self.num_envs
        words = random_bits_span(self.key, Stream.LOB_INFORMED, first, cfg.events_per_step, N)
        flip = below(words[0, :, 1], 1000) < cfg.informed_flip_permille  # ⌊w·1000 / 2³²⌋ < ‰
        self.direction[flip] = -self.direction[flip]
        informed = below(words[:, :, 0], 100) < cfg.informed_pct  # ⌊w·100 / 2³²⌋ < %
        return np.where(informed, self.direction[None, :], 0)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The markets as they are, as host arrays: load them into markets of the same seed,
        settings and count (`load_state_dict`) and those step on exactly as these would."""
        host = np.array if self.xp is np else (lambda array: array.get())
        state = {f"books/{name}": host(getattr(self.books, name)) for name in BOOK_STATE}
        state.update({f"market/{name}": host(getattr(self, name)) for name in MARKET_STATE})
        state["market/observation"] = host(self._last_obs)
        state["market/counters"] = np.array([self.calls, self.clock], dtype=np.int64)
        state["market/key"] = np.array(self.key, dtype=np.uint64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Take the state `state_dict` gave, checked whole first: ValueError naming the first
        array that is missing, extra or of another shape or dtype, or markets of another seed;
        nothing changes then."""
        mine = self.state_dict()
        if set(state) != set(mine):
            raise ValueError(f"market state: expected the arrays {sorted(mine)}, got "
                             f"{sorted(state)}")  # fmt: skip
        for name, array in mine.items():
            got = state[name]
            if got.shape != array.shape or got.dtype != array.dtype:
                raise ValueError(
                    f"market state {name}: expected {array.dtype} {list(array.shape)}, got "
                    f"{got.dtype} {list(got.shape)}"
                )
        if not np.array_equal(state["market/key"], mine["market/key"]):
            raise ValueError("market state market/key: expected the markets' own seed's key, "
                             "got another seed's")  # fmt: skip
        xp = self.xp
        for name in BOOK_STATE:  # in place: the device market holds the books' arrays
            getattr(self.books, name)[...] = xp.asarray(state[f"books/{name}"])
        for name in MARKET_STATE:
            getattr(self, name)[...] = xp.asarray(state[f"market/{name}"])
        self._last_obs = xp.asarray(state["market/observation"]).copy()
        self.calls, self.clock = (int(value) for value in state["market/counters"])

    # ----------------------------------------------------------------------------- internals
    def _reset(self) -> None:
        """Fresh books, flow weights and accounts for every market (a new episode)."""
        xp = self.xp
        cfg, books, N = self.cfg, self.books, self.num_envs
        depth = cfg.initial_depth
        words = self._random_bits(Stream.LOB_RESET, N * (depth // 2 + 2))
        words = words.reshape(N, -1).astype(xp.uint64)  # [N, 4·(depth/2 + 2)]
        if cfg.informed_pct:  # the hidden direction: up where ⌊w·2 / 2³²⌋ = 0
            up = self._random_bits(Stream.LOB_INFORMED, N)[:, 0] < np.uint32(1 << 31)
            self.direction[...] = xp.where(up, 1, -1)
        self.calls += 1
        sizes = 1 + ((words[:, : 2 * depth] * np.uint64(cfg.max_order_lots))
                     >> np.uint64(32)).astype(xp.int64)  # fmt: skip
        spread = cfg.randomize_pct
        factors = (
            100
            - spread
            + (
                (words[:, 2 * depth : 2 * depth + 3] * np.uint64(2 * spread + 1)) >> np.uint64(32)
            ).astype(xp.int64)
        )
        centre = cfg.price_levels // 2
        books.lots[...] = 0
        books.lots[BID][:, centre - 1 - xp.arange(depth)] = sizes[:, :depth]
        books.lots[ASK][:, centre + 1 + xp.arange(depth)] = sizes[:, depth:]
        books.base[...] = BASE_PRICE - centre
        for array in (books.agent_qty, books.agent_ahead):
            array[...] = 0
        books.agent_px[...] = -1
        books.inventory[...] = 0
        books.cash[...] = 0
        self.limit_w[...] = scaled(self._limit_weights, factors[:, 0])
        self.cancel_w[...] = cfg.cancel_weight * factors[:, 1] // 100
        self.market_w[...] = cfg.market_weight * factors[:, 2] // 100
        self.t[...] = 0
        self.clock = 0
        self.excitation[...] = 0
        self.truncated_lots[...] = 0
        self.variance[...] = 0.0
        self.flow_ema[...] = 0.0
        self.mid2[...] = self._mid2()

    def _random_bits(self, stream: Stream, n: int) -> np.ndarray:
        """`random_bits(key, stream, self.calls, n)` [n, 4] uint32, drawn on the backend."""
        if self._market is not None:
            return self._market.random_bits(stream, self.calls, n)
        return random_bits(self.key, stream, self.calls, n)

    def recentre(self) -> None:
        """Shift the window of every book whose mid drifted more than `recentre_ticks` from
        its centre, so the mid is central again (`step` calls it; public so that a shift can be
        driven on a hand-set mid). Background lots shifted past an edge are
        counted in `truncated_lots` (never silently lost); an agent order past an edge is
        cancelled and its lots counted too. Cash and PnL are unchanged (prices are base +
        index, and base moves with the window)."""
        xp, books, P = self.xp, self.books, self.cfg.price_levels
        shift = self.mid2 // 2 - P // 2
        shift = xp.where(xp.abs(shift) > self.cfg.recentre_ticks, shift, 0)
        if xp is np and not shift.any():  # nothing moves (on the device: no read to know it)
            return
        source = xp.arange(P)[None, :] + shift[:, None]  # new index i holds old index i + shift
        inside = (source >= 0) & (source < P)
        clipped = xp.clip(source, 0, P - 1)
        before = books.lots.sum(axis=2)
        for side in (BID, ASK):
            moved = xp.take_along_axis(books.lots[side], clipped, axis=1)
            books.lots[side] = xp.where(inside, moved, 0)
        self.truncated_lots += (before - books.lots.sum(axis=2)).sum(axis=0)
        resting = books.agent_px >= 0
        px = books.agent_px - shift[None, :]
        off = resting & ((px < 0) | (px >= P))
        self.truncated_lots += xp.where(off, books.agent_qty, 0).sum(axis=0)
        books.agent_px = xp.where(resting & ~off, px, -1)
        books.agent_qty = xp.where(off, 0, books.agent_qty)
        books.agent_ahead = xp.where(off, 0, books.agent_ahead)
        books.base += shift
        self.mid2 = self.mid2 - 2 * shift

    def _mid2(self) -> np.ndarray:
        """2 · mid price as a window index (one side empty: that side's touch ± 1 tick)."""
        xp = self.xp
        bid, ask = self.books.best(BID), self.books.best(ASK)
        centre = self.cfg.price_levels // 2
        bid = xp.where(bid >= 0, bid, xp.where(ask >= 0, ask - 1, centre - 1))
        ask = xp.where(ask >= 0, ask, bid + 1)
        return bid + ask

    def _latency(self) -> np.ndarray:
        xp = self.xp
        if not self.cfg.random_latency:
            return xp.full(self.num_envs, self.cfg.latency_events, dtype=xp.int64)
        words = self._random_bits(Stream.LOB_LATENCY, self.num_envs)[:, 0]
        self.calls += 1
        span = np.uint64(self.cfg.latency_events + 1)
        return ((words.astype(xp.uint64) * span) >> np.uint64(32)).astype(xp.int64)

    def _agent_messages(self, actions: np.ndarray) -> list[Messages]:
        """Up to two messages per env for its action (bid side first), from the observed book."""
        xp = self.xp
        cfg, books, N = self.cfg, self.books, self.num_envs
        zero = xp.zeros(N, dtype=xp.int64)
        bid, ask = books.best(BID), books.best(ASK)
        quoting = self._quoting[actions]
        bid_px = xp.where(bid >= 0, bid, self.mid2 // 2) - self._behind[actions, 0]
        ask_px = xp.where(ask >= 0, ask, (self.mid2 + 1) // 2) + self._behind[actions, 1]
        # quotes: re-sent only where the price changes
        resend_bid = quoting & (books.agent_px[BID] != bid_px)
        resend_ask = quoting & (books.agent_px[ASK] != ask_px)
        cancel = actions == 1
        buy, sell = actions == 7, actions == 8
        first = Messages(
            kind=xp.where(resend_bid, LIMIT, xp.where(cancel, CANCEL, 0))
            + xp.where(buy | sell, MARKET, 0),
            side=xp.where(sell, SELL, BUY) + zero,
            owner=zero + AGENT,
            price=xp.where(resend_bid, bid_px, 0),
            qty=xp.where(resend_bid, cfg.quote_size, xp.where(buy | sell, cfg.market_size, 0)),
            position=zero,
        )
        second = Messages(
            kind=xp.where(resend_ask, LIMIT, xp.where(cancel, CANCEL, 0)) + zero,
            side=zero + SELL,
            owner=zero + AGENT,
            price=xp.where(resend_ask, ask_px, 0),
            qty=xp.where(resend_ask, cfg.quote_size, 0) + zero,
            position=zero.copy(),
        )
        return [first, second]

    def _account(self, fills, taken: np.ndarray, passive: np.ndarray, flow: np.ndarray) -> None:
        """Per env: lots the agent took, lots of its resting orders filled, signed flow."""
        np.add.at(taken, fills.env[fills.aggressor == AGENT], fills.qty[fills.aggressor == AGENT])
        np.add.at(passive, fills.env[fills.resting == AGENT], fills.qty[fills.resting == AGENT])
        np.add.at(flow, fills.env, fills.side * fills.qty)

    def _liquidate(self) -> None:
        """Close every market's inventory at the far touch (the mid if it is empty) and cancel
        the agent's quotes: the episode ends."""
        xp = self.xp
        books = self.books
        bid, ask = books.best(BID), books.best(ASK)
        mid = self.mid2 // 2
        far = xp.where(
            books.inventory > 0, xp.where(bid >= 0, bid, mid), xp.where(ask >= 0, ask, mid)
        )
        books.cash += books.inventory * (books.base + far)
        books.inventory[...] = 0
        # the mark used by the reward is then irrelevant: inventory is zero
        books.agent_px[...] = -1
        books.agent_qty[...] = 0
        books.agent_ahead[...] = 0

    def _levels(self, side: int) -> tuple[np.ndarray, np.ndarray]:
        """Total lots (background + agent) at the visible levels from `side`'s touch outward,
        and the touch (-1 when that side is empty)."""
        xp = self.xp
        books, L, N = self.books, self.cfg.visible_levels, self.num_envs
        touch = books.best(side)
        step = -1 if side == BID else 1
        prices = touch[:, None] + step * xp.arange(L)[None, :]
        inside = (touch[:, None] >= 0) & (prices >= 0) & (prices < self.cfg.price_levels)
        safe = xp.clip(prices, 0, self.cfg.price_levels - 1)
        lots = books.lots[side][xp.arange(N)[:, None], safe]
        lots = lots + xp.where(
            books.agent_px[side][:, None] == safe, books.agent_qty[side][:, None], 0
        )
        return xp.where(inside, lots, 0), touch

    def _observe(self, change: np.ndarray, flow: np.ndarray) -> np.ndarray:
        """The observation (SPEC.md's table); `flow`: the step's signed flow, normalised."""
        xp = self.xp
        cfg, books = self.cfg, self.books
        L, scale = cfg.visible_levels, 4.0 * cfg.max_order_lots
        bid_lots, bid = self._levels(BID)
        ask_lots, ask = self._levels(ASK)
        mid = self.mid2 / 2.0
        ladder = xp.arange(L)[None, :]
        bid_offset = (xp.where(bid >= 0, bid, mid)[:, None] - ladder - mid[:, None]) / L
        ask_offset = (xp.where(ask >= 0, ask, mid)[:, None] + ladder - mid[:, None]) / L
        spread = xp.where((bid >= 0) & (ask >= 0), ask - bid, 0)
        b5, a5 = bid_lots[:, :5].sum(axis=1), ask_lots[:, :5].sum(axis=1)
        value = books.cash + books.inventory * (books.base + mid)
        # The inventory in a scale a network can use: the reward's penalty φq² and the
        # liquidation risk grow with q², so |q| of 2-4 lots matters (q / max_inventory ≈ 0.1
        # would not), and its weight depends on the time left.
        q = books.inventory / INVENTORY_SCALE
        time_left = 1.0 - self.t / cfg.horizon
        quote = [
            xp.where(books.agent_px[s] >= 0, xp.abs(books.agent_px[s] - t), -1) / L
            for s, t in ((BID, bid), (ASK, ask))
        ]
        scalars = xp.stack(
            [
                spread / L,
                change,
                _imbalance(bid_lots[:, 0], ask_lots[:, 0]),
                _imbalance(b5, a5),
                flow,
                self.flow_ema,
                xp.sqrt(self.variance),
                q,
                q * q,
                q * time_left,
                value / 100.0,
                time_left,
                quote[0],
                quote[1],
                books.agent_ahead[BID] / scale,
                books.agent_ahead[ASK] / scale,
            ],
            axis=1,
        )
        return xp.concatenate(
            [bid_offset, bid_lots / scale, ask_offset, ask_lots / scale, scalars], axis=1
        ).astype(xp.float32)

    def _labels(self, obs: np.ndarray) -> np.ndarray:
        """Aux targets for the previous observation: spread, L1 imbalance and realised
        volatility now, the columns of the observation `obs` of this state."""
        return obs[:, self._label_columns]


def _imbalance(bid: np.ndarray, ask: np.ndarray) -> np.ndarray:
    total = bid + ask
    return (bid - ask) / (total + (total == 0))  # 0 where both sides are empty


def _fields(messages: Messages) -> tuple[np.ndarray, ...]:
    return (messages.kind, messages.side, messages.owner, messages.price, messages.qty,
            messages.position)  # fmt: skip
