"""Background order flow: zero-intelligence limit, cancel and market arrivals.

Each background event is one draw from the embedded jump chain of competing Poisson arrivals:
an event's kind is picked with probability proportional to its weight, with integer weights so
the pick is exact on any device (a Philox word w picks ⌊w · W / 2³²⌋ in [0, W), W the total).

Weights per env (fixed at reset, each family scaled by its own factor in 1 ± randomize %):
- a limit buy or sell at distance d = 0 .. visible_levels-1 ticks behind the price that would
  improve the opposite touch by one tick: limit_weight · (limit_decay_pct / 100)^d (integer
  steps); a buy at d goes to best_ask - 1 - d (best_bid - d when there are no asks);
- a cancel: cancel_weight per resting background lot — a lot is picked uniformly, and a run of
  lots starting at it is cancelled (so deep queues shrink faster, as in Cont-Stoikov-Talreja);
- a market buy or sell: market_weight each.
Sizes are uniform in 1 .. max_order_lots.

Informed flow (`lobsim.informed_pct` > 0): a market order whose event drew the informed coin
takes the side of its market's hidden direction instead of its own (env.py draws the coin and
keeps the direction), so informed buying lifts the ask while the direction is up and a quote on
the wrong side is filled just before the mid moves through it (adverse selection).
"""

from __future__ import annotations

import numpy as np

from service.config import LobsimConfig
from service.lobsim.book import (
    ASK,
    BACKGROUND,
    BID,
    BUY,
    CANCEL,
    LIMIT,
    MARKET,
    SELL,
    Books,
    Messages,
)


def limit_weights(cfg: LobsimConfig) -> np.ndarray:
    """Integer weight of a limit order at each distance d from the improving price."""
    weights = [cfg.limit_weight]
    for _ in range(1, cfg.visible_levels):
        weights.append(weights[-1] * cfg.limit_decay_pct // 100)
    return np.array(weights, dtype=np.int64)


def scaled(weights: np.ndarray, factor_pct: np.ndarray) -> np.ndarray:
    """weights [..., K] × factor % per env [N] -> [N, K], integer (floor)."""
    return weights[None, :] * factor_pct[:, None] // 100


def background_messages(
    books: Books, bits: np.ndarray, limit_w: np.ndarray, cancel_w: np.ndarray, market_w: np.ndarray,
    max_order_lots: int, informed_side: np.ndarray | None = None,
) -> Messages:  # fmt: skip
    """One background event per env from Philox words `bits` [N, 4] (words 0: kind, 1: size).

    limit_w [N, D] (per side), cancel_w [N] (per lot), market_w [N] (per side).
    informed_side [N] (optional): +1 / -1 where this event's order, if it is a market order, is
    informed and takes that side; 0 where it is not (its side is then the pick's).
    """
    N = limit_w.shape[0]
    envs = np.arange(N)
    lots_per_side = books.lots.sum(axis=2)  # [2, N]
    bg_lots = lots_per_side.sum(axis=0)  # [N]
    limit_total = limit_w.sum(axis=1)
    # Layout of [0, W): limit buys, limit sells, market buy, market sell, cancels (bid lots by
    # price index, then ask lots by price index).
    total = 2 * limit_total + 2 * market_w + cancel_w * bg_lots
    pick = ((bits[:, 0].astype(np.uint64) * total.astype(np.uint64)) >> np.uint64(32)).astype(
        np.int64
    )
    size = 1 + ((bits[:, 1].astype(np.uint64) * np.uint64(max_order_lots)) >> np.uint64(32))
    size = size.astype(np.int64)

    kind = np.full(N, CANCEL, dtype=np.int64)
    side = np.full(N, BUY, dtype=np.int64)
    price = np.zeros(N, dtype=np.int64)
    position = np.zeros(N, dtype=np.int64)

    # limit orders: which side and distance
    is_limit = pick < 2 * limit_total
    sells = is_limit & (pick >= limit_total)
    offset = np.where(sells, pick - limit_total, pick)
    cumulative = np.cumsum(limit_w, axis=1)
    distance = np.argmax(cumulative > offset[:, None], axis=1)
    best_bid, best_ask = books.best(BID), books.best(ASK)
    centre = books.price_levels // 2
    buy_anchor = np.where(best_ask >= 0, best_ask - 1, np.where(best_bid >= 0, best_bid, centre))
    sell_anchor = np.where(best_bid >= 0, best_bid + 1, np.where(best_ask >= 0, best_ask, centre))
    kind[is_limit] = LIMIT
    side[sells] = SELL
    price = np.where(is_limit, np.where(sells, sell_anchor + distance, buy_anchor - distance), 0)

    # market orders
    rest = pick - 2 * limit_total
    is_market = ~is_limit & (rest < 2 * market_w)
    kind[is_market] = MARKET
    side[is_market & (rest >= market_w)] = SELL
    if informed_side is not None:  # the pick still decides that it is a market order
        side = np.where(is_market & (informed_side != 0), informed_side, side)

    # cancels: the picked lot, then its level and its place in that level's queue
    is_cancel = ~is_limit & ~is_market
    lot = (rest - 2 * market_w) // np.maximum(cancel_w, 1)
    on_ask = is_cancel & (lot >= lots_per_side[BID])
    lot_in_side = np.where(on_ask, lot - lots_per_side[BID], lot)
    side_lots = np.where(on_ask[:, None], books.lots[ASK], books.lots[BID])  # [N, P]
    running = np.cumsum(side_lots, axis=1)
    level = np.argmax(running > lot_in_side[:, None], axis=1)
    before = running[envs, level] - side_lots[envs, level]
    side[on_ask] = SELL
    price = np.where(is_cancel, level, price)
    position = np.where(is_cancel, lot_in_side - before, 0)
    return Messages(
        kind=kind,
        side=side,
        owner=np.full(N, BACKGROUND, dtype=np.int64),
        price=price,
        qty=size,
        position=position,
    )
