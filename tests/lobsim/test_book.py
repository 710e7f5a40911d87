"""The vectorised matching core (service/lobsim/book.py) against the scalar reference engine
(service/lobsim/reference.py) on random message streams, with SPEC.md's invariants after
every call."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from conftest import fresh_seed

from service.lobsim.book import (
    AGENT,
    ASK,
    BACKGROUND,
    BID,
    BUY,
    CANCEL,
    LIMIT,
    MARKET,
    NONE,
    SELL,
    Books,
    Fills,
    Messages,
)
from service.lobsim.reference import ReferenceMarket

P = 24  # price levels of the window


def random_messages(rng: np.random.Generator, books: Books) -> Messages:
    """One message per env: mostly near-touch limit orders, cancels of lots that exist,
    market orders, some from the agent, a few outside the window."""
    N = books.num_envs
    kind = rng.choice([NONE, LIMIT, CANCEL, MARKET], size=N, p=[0.05, 0.5, 0.3, 0.15])
    side = rng.choice([BUY, SELL], size=N)
    owner = np.where(rng.random(N) < 0.15, AGENT, BACKGROUND)
    centre = P // 2 + rng.integers(-3, 4, size=N)
    # buys mostly below the centre, sells above; some cross
    price = np.where(side == BUY, centre - rng.integers(-2, 6, N), centre + rng.integers(-2, 6, N))
    price = np.where(rng.random(N) < 0.02, rng.choice([-3, P + 2], size=N), price)
    qty = rng.integers(1, 8, size=N)
    own = np.where(side == BUY, BID, ASK)
    held = books.lots[own, np.arange(N), np.clip(price, 0, P - 1)]
    position = (rng.random(N) * (held + 2)).astype(np.int64)  # sometimes past the end
    return Messages(
        kind=kind.astype(np.int64),
        side=side.astype(np.int64),
        owner=owner.astype(np.int64),
        price=price.astype(np.int64),
        qty=qty.astype(np.int64),
        position=position,
    )


def merged(fills: list) -> list[tuple]:
    """Reference fills of one message with consecutive background fills at one price merged
    (the vectorised core books a run of background lots as one fill)."""
    out: list[list] = []
    for f in fills:
        row = [f.seq, f.aggressor_owner, f.resting_owner, f.side, f.price, f.qty]
        if out and out[-1][:5] == row[:5] and row[2] == BACKGROUND:
            out[-1][5] += row[5]
        else:
            out.append(row)
    return [tuple(r) for r in out]


def of_env(fills: Fills, env: int) -> list[tuple]:
    rows = np.flatnonzero(fills.env == env)
    return [
        tuple(int(x) for x in (fills.seq[i], fills.aggressor[i], fills.resting[i],
                               fills.side[i], fills.price[i], fills.qty[i]))
        for i in rows
    ]  # fmt: skip


def check_invariants(books: Books) -> None:
    assert (books.lots >= 0).all() and (books.agent_qty >= 0).all()
    assert ((books.agent_qty > 0) == (books.agent_px >= 0)).all()
    bid, ask = books.best(BID), books.best(ASK)
    assert ((bid < 0) | (ask < 0) | (bid < ask)).all(), "crossed or locked book"
    for side in (BID, ASK):
        resting = books.agent_px[side] >= 0
        at = books.lots[side, np.arange(books.num_envs), np.clip(books.agent_px[side], 0, None)]
        assert (books.agent_ahead[side][resting] <= at[resting]).all()
        assert (books.agent_ahead[side][~resting] == 0).all()


def test_core_equals_reference_and_keeps_the_invariants() -> None:
    rng = np.random.default_rng(fresh_seed())
    N, calls = 64, 1500
    base = rng.integers(900, 1100, size=N)
    books = Books(N, P, base)
    markets = [ReferenceMarket(P, int(b)) for b in base]
    streams = [hashlib.sha256() for _ in range(N)]
    agent_fills = [[0, 0] for _ in range(N)]  # signed lots, signed cash
    for seq in range(calls):
        messages = random_messages(rng, books)
        fills = books.apply(messages, seq)
        check_invariants(books)
        for n, market in enumerate(markets):
            want = merged(
                market.apply(*(int(getattr(messages, f)[n]) for f in (
                    "kind", "side", "owner", "price", "qty", "position")), seq=seq)
            )  # fmt: skip
            got = of_env(fills, n)
            assert got == want, (seq, n, messages, got, want)
            streams[n].update(repr(got).encode())
            for _, aggressor, resting, side, price, qty in got:
                for who, sign in ((aggressor, side), (resting, -side)):
                    if who == AGENT:
                        agent_fills[n][0] += sign * qty
                        agent_fills[n][1] -= sign * qty * (int(base[n]) + price)
        if seq % 50 == 0 or seq == calls - 1:
            for n, market in enumerate(markets):
                assert books.lots[BID, n].tolist() == list(market.bid_totals()), (seq, n)
                assert books.lots[ASK, n].tolist() == list(market.ask_totals()), (seq, n)
                for side, s in ((BID, BUY), (ASK, SELL)):
                    assert books.agent_px[side, n] == market.agent_px(s)
                    assert books.agent_qty[side, n] == market.agent_qty(s)
                    assert books.agent_ahead[side, n] == market.agent_ahead(s)
                assert (books.inventory[n], books.cash[n]) == (market.inventory, market.cash)
                assert (books.overflow[n], books.traded[n]) == (market.overflow, market.traded)
    assert [list(x) for x in zip(books.inventory, books.cash, strict=True)] == agent_fills
    assert books.traded.sum() > 0 and books.overflow.sum() > 0
    assert (books.agent_px >= 0).any() and (books.agent_ahead > 0).any()


def test_same_seed_same_fill_stream() -> None:
    def run(seed: int) -> str:
        rng = np.random.default_rng(seed)
        books = Books(8, P, np.full(8, 1000))
        digest = hashlib.sha256()
        for seq in range(300):
            fills = books.apply(random_messages(rng, books), seq)
            for name in ("env", "aggressor", "resting", "side", "price", "qty"):
                digest.update(getattr(fills, name).tobytes())
        return digest.hexdigest()

    seed = fresh_seed()
    assert run(seed) == run(seed)
    assert run(seed) != run(seed + 1)


@pytest.mark.parametrize("agent_at", [0, 3, 5])
def test_market_order_fills_ahead_then_agent_then_behind(agent_at: int) -> None:
    """Background 5 lots at one ask price with the agent's 2 lots after `agent_at` of them."""
    books = Books(1, P, np.array([100]))
    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731

    def send(kind: int, side: int, owner: int, price: int, qty: int, position: int = 0) -> Fills:
        return books.apply(Messages(*(one(v) for v in (kind, side, owner, price, qty,
                                                       position))), 0)  # fmt: skip

    send(LIMIT, SELL, BACKGROUND, 10, agent_at)
    send(LIMIT, SELL, AGENT, 10, 2)
    send(LIMIT, SELL, BACKGROUND, 10, 5 - agent_at)
    assert books.agent_ahead[ASK, 0] == agent_at
    fills = send(MARKET, BUY, BACKGROUND, 0, 6)
    owners = [(int(r), int(q)) for r, q in zip(fills.resting, fills.qty, strict=True)]
    ahead = min(6, agent_at)
    agent = min(6 - ahead, 2)
    behind = min(6 - ahead - agent, 5 - agent_at)
    want = [(BACKGROUND, ahead), (AGENT, agent), (BACKGROUND, behind)]
    assert owners == [w for w in want if w[1] > 0]
    assert books.inventory[0] == -agent and books.cash[0] == agent * 110
