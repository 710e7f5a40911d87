"""The scalar LobSim reference engine against hand-worked scenarios of SPEC.md, and a random run.

The random run draws a fresh seed each time; it is printed (shown on failure) and can be pinned
with TRIDENT_TEST_SEED=<seed>.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.lobsim.reference import (
    AGENT,
    BACKGROUND,
    BUY,
    CANCEL,
    LIMIT,
    MARKET,
    NONE,
    SELL,
    Fill,
    Order,
    ReferenceMarket,
)

P, BASE = 10, 100


def limit(
    m: ReferenceMarket, side: int, owner: int, price: int, qty: int, seq: int = 0
) -> list[Fill]:
    return m.apply(LIMIT, side, owner, price, qty, 0, seq)


def market(m: ReferenceMarket, side: int, owner: int, qty: int, seq: int = 0) -> list[Fill]:
    return m.apply(MARKET, side, owner, 0, qty, 0, seq)


def cancel(m: ReferenceMarket, side: int, price: int, qty: int, position: int) -> list[Fill]:
    return m.apply(CANCEL, side, BACKGROUND, price, qty, position, 0)


def cancel_agent(m: ReferenceMarket, side: int) -> list[Fill]:
    return m.apply(CANCEL, side, AGENT, 0, 1, 0, 0)


def agent_flow(fills: list[Fill], base: int) -> tuple[int, int]:
    """(inventory, cash) of the agent: signed sums over its fills."""
    inventory = cash = 0
    for f in fills:
        for owner, sign in ((f.aggressor_owner, f.side), (f.resting_owner, -f.side)):
            if owner == AGENT:
                inventory += sign * f.qty
                cash -= sign * f.qty * (base + f.price)
    return inventory, cash


def snapshot(m: ReferenceMarket) -> tuple:
    """Everything but the overflow counter."""
    queues = tuple(tuple(m.queue(side, p)) for side in (BUY, SELL) for p in range(P))
    counters = (m.background_added, m.background_cancelled, m.background_traded)
    return queues, m.inventory, m.cash, m.traded, counters


def test_market_sweeps_levels_through_the_agent_queue() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, SELL, BACKGROUND, 4, 3)
    limit(m, SELL, AGENT, 4, 2)
    limit(m, SELL, BACKGROUND, 4, 4)
    limit(m, SELL, BACKGROUND, 4, 1)
    limit(m, SELL, BACKGROUND, 6, 5)
    assert m.ask_totals() == [0, 0, 0, 0, 8, 0, 5, 0, 0, 0]
    assert m.queue(SELL, 4) == [(BACKGROUND, 3), (AGENT, 2), (BACKGROUND, 4), (BACKGROUND, 1)]
    assert (m.agent_px(SELL), m.agent_qty(SELL), m.agent_ahead(SELL)) == (4, 2, 3)

    fills = market(m, BUY, BACKGROUND, 12, seq=5)
    # Ahead first, then the agent, then both behind orders as one run, then the next level.
    assert fills == [
        Fill(5, BACKGROUND, BACKGROUND, BUY, 4, 3),
        Fill(5, BACKGROUND, AGENT, BUY, 4, 2),
        Fill(5, BACKGROUND, BACKGROUND, BUY, 4, 5),
        Fill(5, BACKGROUND, BACKGROUND, BUY, 6, 2),
    ]
    assert m.ask_totals() == [0, 0, 0, 0, 0, 0, 3, 0, 0, 0]
    assert (m.agent_px(SELL), m.agent_qty(SELL), m.agent_ahead(SELL)) == (-1, 0, 0)
    assert (m.inventory, m.cash, m.traded) == (-2, 2 * 104, 12)
    m.check_invariants()


def test_market_stops_inside_the_agent_order() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, SELL, BACKGROUND, 4, 3)
    limit(m, SELL, AGENT, 4, 2)
    limit(m, SELL, BACKGROUND, 4, 4)
    assert market(m, BUY, BACKGROUND, 4, seq=7) == [
        Fill(7, BACKGROUND, BACKGROUND, BUY, 4, 3),
        Fill(7, BACKGROUND, AGENT, BUY, 4, 1),
    ]
    assert (m.agent_px(SELL), m.agent_qty(SELL), m.agent_ahead(SELL)) == (4, 1, 0)
    limit(m, SELL, BACKGROUND, 4, 2)  # arrives behind: ahead stays 0
    assert m.queue(SELL, 4) == [(AGENT, 1), (BACKGROUND, 4), (BACKGROUND, 2)]
    assert m.agent_ahead(SELL) == 0
    assert market(m, BUY, BACKGROUND, 2, seq=9) == [
        Fill(9, BACKGROUND, AGENT, BUY, 4, 1),
        Fill(9, BACKGROUND, BACKGROUND, BUY, 4, 1),
    ]
    assert m.queue(SELL, 4) == [(BACKGROUND, 3), (BACKGROUND, 2)]
    assert (m.inventory, m.cash, m.traded) == (-2, 2 * 104, 6)
    m.check_invariants()


def test_sell_limit_crosses_bids_best_first_then_rests() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, BUY, BACKGROUND, 5, 2)
    limit(m, BUY, AGENT, 5, 1)
    limit(m, BUY, BACKGROUND, 3, 4)
    assert (m.agent_px(BUY), m.agent_ahead(BUY)) == (5, 2)

    fills = limit(m, SELL, BACKGROUND, 3, 9, seq=4)
    assert fills == [
        Fill(4, BACKGROUND, BACKGROUND, SELL, 5, 2),
        Fill(4, BACKGROUND, AGENT, SELL, 5, 1),
        Fill(4, BACKGROUND, BACKGROUND, SELL, 3, 4),
    ]
    assert m.bid_totals() == [0] * P
    assert m.ask_totals() == [0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
    assert m.agent_px(BUY) == -1
    assert (m.inventory, m.cash, m.traded) == (1, -105, 7)
    assert (m.background_added, m.background_traded) == (8, 6)
    m.check_invariants()


def test_buy_limit_stops_at_its_price_and_rests_behind_background() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, SELL, BACKGROUND, 3, 2)
    limit(m, SELL, BACKGROUND, 5, 3)
    assert limit(m, BUY, AGENT, 4, 4, seq=2) == [Fill(2, AGENT, BACKGROUND, BUY, 3, 2)]
    assert (m.agent_px(BUY), m.agent_qty(BUY), m.agent_ahead(BUY)) == (4, 2, 0)
    assert m.ask_totals() == [0, 0, 0, 0, 0, 3, 0, 0, 0, 0]
    assert (m.inventory, m.cash) == (2, -2 * 103)

    assert limit(m, SELL, AGENT, 5, 1) == []  # bids <= 4 do not cross 5: rests behind 3 lots
    assert m.queue(SELL, 5) == [(BACKGROUND, 3), (AGENT, 1)]
    assert (m.agent_px(SELL), m.agent_qty(SELL), m.agent_ahead(SELL)) == (5, 1, 3)
    m.check_invariants()


def test_background_cancel_straddling_the_agent() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, BUY, BACKGROUND, 3, 4)
    limit(m, BUY, AGENT, 3, 2)
    limit(m, BUY, BACKGROUND, 3, 5)
    assert (m.bid_totals()[3], m.agent_ahead(BUY)) == (9, 4)

    cancel(m, BUY, 3, 4, 2)  # positions 2, 3 are ahead, 4, 5 behind
    assert m.queue(BUY, 3) == [(BACKGROUND, 2), (AGENT, 2), (BACKGROUND, 3)]
    assert (m.bid_totals()[3], m.agent_ahead(BUY), m.agent_qty(BUY)) == (5, 2, 2)
    assert m.background_cancelled == 4
    m.check_invariants()

    cancel(m, BUY, 3, 100, 3)  # clipped to positions 3, 4: all behind
    assert m.queue(BUY, 3) == [(BACKGROUND, 2), (AGENT, 2), (BACKGROUND, 1)]
    assert (m.agent_ahead(BUY), m.background_cancelled) == (2, 6)
    m.check_invariants()

    before = snapshot(m)
    cancel(m, BUY, 3, 1, 3)  # position == book: nothing
    cancel(m, BUY, 7, 2, 0)  # empty price: nothing
    cancel(m, SELL, 3, 2, 0)  # empty on that side: nothing
    assert snapshot(m) == before

    cancel(m, BUY, 3, 2, 0)  # the whole ahead run
    assert m.queue(BUY, 3) == [(AGENT, 2), (BACKGROUND, 1)]
    assert (m.agent_ahead(BUY), m.agent_qty(BUY), m.background_cancelled) == (0, 2, 8)
    m.check_invariants()


def test_background_cancel_spanning_several_orders() -> None:
    m = ReferenceMarket(P, BASE)
    for owner, qty in ((BACKGROUND, 2), (BACKGROUND, 3), (AGENT, 1), (BACKGROUND, 4)):
        limit(m, SELL, owner, 6, qty)
    assert m.agent_ahead(SELL) == 5
    cancel(m, SELL, 6, 6, 1)  # positions 1..6: 1 + 3 lots ahead, 2 behind
    assert m.queue(SELL, 6) == [(BACKGROUND, 1), (AGENT, 1), (BACKGROUND, 2)]
    assert (m.agent_ahead(SELL), m.ask_totals()[6], m.background_cancelled) == (1, 3, 6)
    m.check_invariants()


def test_agent_limit_replaces_its_order_and_loses_priority() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, BUY, BACKGROUND, 2, 1)
    limit(m, BUY, AGENT, 2, 3)
    limit(m, BUY, BACKGROUND, 2, 2)
    limit(m, SELL, AGENT, 8, 1)
    assert m.agent_ahead(BUY) == 1

    limit(m, BUY, AGENT, 2, 4)  # same price: back of the queue
    assert m.queue(BUY, 2) == [(BACKGROUND, 1), (BACKGROUND, 2), (AGENT, 4)]
    assert (m.agent_px(BUY), m.agent_qty(BUY), m.agent_ahead(BUY)) == (2, 4, 3)

    limit(m, BUY, AGENT, 5, 1)  # another price: the old order is gone
    assert m.queue(BUY, 2) == [(BACKGROUND, 1), (BACKGROUND, 2)]
    assert (m.agent_px(BUY), m.agent_qty(BUY), m.agent_ahead(BUY)) == (5, 1, 0)
    assert (m.agent_px(SELL), m.agent_qty(SELL)) == (8, 1)
    m.check_invariants()

    cancel_agent(m, BUY)
    assert (m.agent_px(BUY), m.agent_qty(BUY)) == (-1, 0)
    assert (m.agent_px(SELL), m.agent_qty(SELL)) == (8, 1)
    before = snapshot(m)
    cancel_agent(m, BUY)  # none left: nothing
    assert snapshot(m) == before
    m.check_invariants()


def test_limit_outside_the_window_only_counts_overflow() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, BUY, BACKGROUND, 2, 3)
    limit(m, BUY, AGENT, 2, 1)
    limit(m, SELL, AGENT, 6, 2)
    limit(m, SELL, BACKGROUND, 7, 2)
    before = snapshot(m)
    for side in (BUY, SELL):
        for owner in (BACKGROUND, AGENT):
            for price in (-1, P):
                assert limit(m, side, owner, price, 5) == []
    assert m.overflow == 8
    assert snapshot(m) == before  # the agent's orders were not cancelled either
    m.check_invariants()


def test_market_on_an_empty_side_fills_nothing() -> None:
    m = ReferenceMarket(P, BASE)
    assert market(m, SELL, AGENT, 3) == []
    limit(m, BUY, BACKGROUND, 2, 3)
    limit(m, BUY, AGENT, 1, 1)
    before = snapshot(m)
    assert market(m, BUY, AGENT, 3) == []
    assert market(m, BUY, BACKGROUND, 3) == []
    assert snapshot(m) == before
    assert (m.traded, m.overflow) == (0, 0)
    m.check_invariants()


def test_self_trade_nets_to_zero() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, SELL, AGENT, 5, 2)
    assert market(m, BUY, AGENT, 2, seq=3) == [Fill(3, AGENT, AGENT, BUY, 5, 2)]
    assert (m.inventory, m.cash, m.traded, m.agent_px(SELL)) == (0, 0, 2, -1)
    m.check_invariants()

    limit(m, SELL, BACKGROUND, 5, 1)
    limit(m, SELL, AGENT, 5, 3)
    assert market(m, BUY, AGENT, 2, seq=6) == [
        Fill(6, AGENT, BACKGROUND, BUY, 5, 1),
        Fill(6, AGENT, AGENT, BUY, 5, 1),
    ]
    assert (m.inventory, m.cash, m.traded) == (1, -105, 4)
    assert (m.agent_px(SELL), m.agent_qty(SELL), m.agent_ahead(SELL)) == (5, 2, 0)
    m.check_invariants()

    # A crossing agent LIMIT trades with its own resting order on the other side; its own
    # earlier order on the LIMIT's side is cancelled first.
    limit(m, BUY, AGENT, 4, 1)
    assert limit(m, SELL, AGENT, 4, 1, seq=8) == [Fill(8, AGENT, AGENT, SELL, 4, 1)]
    assert (m.agent_px(BUY), m.agent_px(SELL)) == (-1, -1)
    assert (m.inventory, m.cash, m.traded) == (1, -105, 5)
    m.check_invariants()


def test_inventory_and_cash_are_signed_sums_of_agent_fills() -> None:
    m = ReferenceMarket(P, BASE)
    fills = []
    fills += limit(m, SELL, BACKGROUND, 2, 3)
    fills += limit(m, SELL, BACKGROUND, 6, 2)
    fills += limit(m, BUY, BACKGROUND, 1, 4)
    fills += market(m, BUY, AGENT, 4, seq=3)
    assert fills == [Fill(3, AGENT, BACKGROUND, BUY, 2, 3), Fill(3, AGENT, BACKGROUND, BUY, 6, 1)]
    assert (m.inventory, m.cash) == (4, -(3 * 102 + 106))
    fills += limit(m, SELL, AGENT, 1, 2, seq=4)
    assert fills[-1] == Fill(4, AGENT, BACKGROUND, SELL, 1, 2)
    assert (m.inventory, m.cash) == (2, -412 + 2 * 101)
    fills += limit(m, BUY, AGENT, 0, 3, seq=5)
    fills += market(m, SELL, BACKGROUND, 5, seq=6)
    assert fills[-2:] == [
        Fill(6, BACKGROUND, BACKGROUND, SELL, 1, 2),
        Fill(6, BACKGROUND, AGENT, SELL, 0, 3),
    ]
    assert (m.inventory, m.cash, m.traded) == (5, -210 - 3 * 100, 11)
    assert agent_flow(fills, BASE) == (m.inventory, m.cash)
    m.check_invariants()


def test_check_invariants_catches_corruption() -> None:
    m = ReferenceMarket(P, BASE)
    limit(m, SELL, BACKGROUND, 5, 2)
    limit(m, BUY, AGENT, 4, 1)
    market(m, SELL, BACKGROUND, 1)
    m.check_invariants()

    m.queues[BUY][5].append(Order(BACKGROUND, 1))
    with pytest.raises(AssertionError, match="crossed or locked"):
        m.check_invariants()
    m.queues[BUY][5].clear()
    m.background_cancelled += 1
    with pytest.raises(AssertionError, match="not conserved"):
        m.check_invariants()
    m.background_cancelled -= 1
    m.cash += 1
    with pytest.raises(AssertionError, match="cash"):
        m.check_invariants()
    m.cash -= 1
    m.check_invariants()


def test_malformed_messages_are_rejected() -> None:
    m = ReferenceMarket(P, BASE)
    assert m.apply(NONE, 0, 7, -5, 0, -1, 0) == []
    for kind, side, owner, qty, position in (
        (4, BUY, BACKGROUND, 1, 0),
        (LIMIT, 0, BACKGROUND, 1, 0),
        (MARKET, BUY, 2, 1, 0),
        (LIMIT, BUY, AGENT, 0, 0),
        (CANCEL, BUY, BACKGROUND, 1, -1),
    ):
        with pytest.raises(ValueError):
            m.apply(kind, side, owner, 1, qty, position, 0)
    assert snapshot(m) == snapshot(ReferenceMarket(P, BASE))


def test_random_messages_keep_the_invariants(rng: np.random.Generator) -> None:
    levels, base, mid = 12, 1000, 6
    m = ReferenceMarket(levels, base)
    fills: list[Fill] = []
    for seq in range(2000):
        kind = int(rng.choice([NONE, LIMIT, CANCEL, MARKET], p=[0.05, 0.55, 0.25, 0.15]))
        side = int(rng.choice([BUY, SELL]))
        owner = AGENT if rng.random() < 0.25 else BACKGROUND
        qty = int(rng.integers(1, 9))
        # Buys mostly below the middle, sells above, both overlapping it; -1 and P overflow.
        price = int(rng.integers(-1, mid + 3) if side == BUY else rng.integers(mid - 3, levels + 1))
        position = 0
        if kind == CANCEL:
            price = int(rng.integers(0, levels))
            book = (m.bid_totals() if side == BUY else m.ask_totals())[price]
            position = int(rng.integers(0, book + 2))
        new = m.apply(kind, side, owner, price, qty, position, seq)
        assert all(f.seq == seq and f.aggressor_owner == owner and f.side == side for f in new)
        fills += new
        m.check_invariants()
        resting = sum(m.bid_totals()) + sum(m.ask_totals())
        assert m.background_added == resting + m.background_cancelled + m.background_traded
    assert agent_flow(fills, base) == (m.inventory, m.cash)
    assert m.traded == sum(f.qty for f in fills)
    assert m.background_traded == sum(f.qty for f in fills if f.resting_owner == BACKGROUND)
    # The run did exercise every path.
    assert m.overflow > 0 and m.background_cancelled > 0
    assert any(f.resting_owner == AGENT for f in fills)
    assert any(f.aggressor_owner == AGENT for f in fills)
