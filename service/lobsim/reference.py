"""Scalar reference engine of the LobSim matching core (SPEC.md), one market per object.

Each side's book is kept literally: per price index a FIFO list of resting orders, each an
owner (background or agent) and a quantity. Background totals, the agent's order and the lots
ahead of it are all read off those lists, never stored on their own, so this engine is the
"obviously correct" twin the vectorised engine (book.py) is differentially tested against.

Fill granularity: an aggressor takes lots from the queue front; consecutive lots taken from the
same resting owner at one price within one message are one fill. At one price that gives at most
three fills (ahead background, agent, behind background), as the SPEC's queue model
(`ahead`, agent, `book - ahead`) does, however many background orders made up those lots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

NONE, LIMIT, CANCEL, MARKET = 0, 1, 2, 3
BACKGROUND, AGENT = 0, 1
BUY, SELL = 1, -1


class Fill(NamedTuple):
    """One (partial) execution; `side` is the aggressor's, `price` a window index."""

    seq: int
    aggressor_owner: int
    resting_owner: int
    side: int
    price: int
    qty: int


@dataclass(slots=True)
class Order:
    """A resting order in a price queue."""

    owner: int
    qty: int


class ReferenceMarket:
    """One market: explicit FIFO queues per price on each side, plus the agent's counters."""

    def __init__(self, price_levels: int, base: int) -> None:
        if price_levels <= 0:
            raise ValueError(f"price_levels must be > 0, got {price_levels}")
        self.price_levels = price_levels
        self.base = base
        self.queues: dict[int, list[list[Order]]] = {
            BUY: [[] for _ in range(price_levels)],
            SELL: [[] for _ in range(price_levels)],
        }
        self.inventory = 0
        self.cash = 0
        self.overflow = 0
        self.traded = 0
        # Background lot accounting for the conservation invariant.
        self.background_added = 0
        self.background_cancelled = 0
        self.background_traded = 0
        # Fills not yet audited by check_invariants, and the totals it rebuilt from earlier ones.
        self._unchecked_fills: list[Fill] = []
        self._audit_inventory = 0
        self._audit_cash = 0
        self._audit_traded = 0

    # ---- messages ---------------------------------------------------------------------------

    def apply(
        self, kind: int, side: int, owner: int, price: int, qty: int, position: int, seq: int
    ) -> list[Fill]:
        """Apply one message; returns its fills in execution order."""
        if kind == NONE:
            return []
        if kind not in (LIMIT, CANCEL, MARKET):
            raise ValueError(f"kind must be 0..3, got {kind}")
        if side not in (BUY, SELL):
            raise ValueError(f"side must be +1 or -1, got {side}")
        if owner not in (BACKGROUND, AGENT):
            raise ValueError(f"owner must be 0 or 1, got {owner}")
        if qty <= 0 and not (kind == CANCEL and owner == AGENT):
            raise ValueError(f"qty must be > 0, got {qty}")
        fills: list[Fill] = []
        if kind == MARKET:
            self._match(seq, side, owner, qty, None, fills)
        elif kind == LIMIT:
            self._limit(seq, side, owner, price, qty, fills)
        elif owner == AGENT:
            self._cancel_agent(side)
        else:
            self._cancel_background(side, price, qty, position)
        self._unchecked_fills.extend(fills)
        return fills

    def _limit(
        self, seq: int, side: int, owner: int, price: int, qty: int, fills: list[Fill]
    ) -> None:
        if not 0 <= price < self.price_levels:
            self.overflow += 1
            return
        if owner == AGENT:
            self._cancel_agent(side)
        remaining = self._match(seq, side, owner, qty, price, fills)
        if remaining > 0:
            self.queues[side][price].append(Order(owner, remaining))
            if owner == BACKGROUND:
                self.background_added += remaining

    def _match(
        self, seq: int, side: int, owner: int, qty: int, limit: int | None, fills: list[Fill]
    ) -> int:
        """Trade against the opposite side, best price first; returns the unfilled quantity."""
        book = self.queues[-side]
        prices = range(self.price_levels) if side == BUY else range(self.price_levels - 1, -1, -1)
        remaining = qty
        for p in prices:
            if remaining == 0:
                break
            if limit is not None and (p > limit if side == BUY else p < limit):
                break
            queue = book[p]
            while remaining > 0 and queue:
                front = queue[0]
                q = min(remaining, front.qty)
                front.qty -= q
                remaining -= q
                if front.qty == 0:
                    queue.pop(0)
                self._execute(seq, side, owner, front.owner, p, q, fills)
        return remaining

    def _execute(
        self,
        seq: int,
        side: int,
        aggressor: int,
        resting: int,
        price: int,
        qty: int,
        fills: list[Fill],
    ) -> None:
        """Book q lots traded at `price`, extending the last fill when it is the same run."""
        last = fills[-1] if fills else None
        if last is not None and last.resting_owner == resting and last.price == price:
            fills[-1] = last._replace(qty=last.qty + qty)
        else:
            fills.append(Fill(seq, aggressor, resting, side, price, qty))
        self.traded += qty
        value = qty * (self.base + price)
        if aggressor == AGENT:
            self.inventory += side * qty
            self.cash -= side * value
        if resting == AGENT:
            self.inventory -= side * qty
            self.cash += side * value
        else:
            self.background_traded += qty

    def _cancel_agent(self, side: int) -> None:
        for queue in self.queues[side]:
            queue[:] = [order for order in queue if order.owner != AGENT]

    def _cancel_background(self, side: int, price: int, qty: int, position: int) -> None:
        """Remove background lots at background positions [position, position + qty)."""
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        if not 0 <= price < self.price_levels:
            return
        queue = self.queues[side][price]
        start, stop = position, position + qty
        first = 0  # background position of the current order's first lot
        for order in queue:
            if order.owner == AGENT:
                continue
            lo, hi = max(start, first), min(stop, first + order.qty)
            first += order.qty
            if lo < hi:
                order.qty -= hi - lo
                self.background_cancelled += hi - lo
        queue[:] = [order for order in queue if order.qty > 0]

    # ---- state in the SPEC's terms ----------------------------------------------------------

    def bid_totals(self) -> list[int]:
        """Background lots resting on the bid side, per price index."""
        return self._background_totals(BUY)

    def ask_totals(self) -> list[int]:
        """Background lots resting on the ask side, per price index."""
        return self._background_totals(SELL)

    def _background_totals(self, side: int) -> list[int]:
        return [
            sum(order.qty for order in queue if order.owner == BACKGROUND)
            for queue in self.queues[side]
        ]

    def queue(self, side: int, price: int) -> list[tuple[int, int]]:
        """The queue at one price, front first, as (owner, qty) pairs."""
        return [(order.owner, order.qty) for order in self.queues[side][price]]

    def _agent_order(self, side: int) -> tuple[int, int, int]:
        """(price, qty, background lots ahead) of the agent's order on `side`, or (-1, 0, 0)."""
        for p, queue in enumerate(self.queues[side]):
            ahead = 0
            for order in queue:
                if order.owner == AGENT:
                    return p, order.qty, ahead
                ahead += order.qty
        return -1, 0, 0

    def agent_px(self, side: int) -> int:
        """Window index of the agent's resting order on `side`, -1 when none."""
        return self._agent_order(side)[0]

    def agent_qty(self, side: int) -> int:
        """Lots of the agent's resting order on `side` (0 when none)."""
        return self._agent_order(side)[1]

    def agent_ahead(self, side: int) -> int:
        """Background lots ahead of the agent's order on `side` in its queue (0 when none)."""
        return self._agent_order(side)[2]

    # ---- invariants -------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first SPEC invariant that does not hold."""
        for side, name in ((BUY, "bid"), (SELL, "ask")):
            agents = 0
            for p, queue in enumerate(self.queues[side]):
                for order in queue:
                    assert order.owner in (BACKGROUND, AGENT), f"{name}[{p}]: bad owner {order}"
                    assert order.qty > 0, f"{name}[{p}]: order with qty <= 0: {order}"
                    agents += order.owner == AGENT
            assert agents <= 1, f"{name}: {agents} agent orders, at most 1 allowed"
            px, qty, ahead = self._agent_order(side)
            assert (qty > 0) == (px >= 0), f"{name}: agent qty {qty} with px {px}"
            book = self._background_totals(side)[px] if px >= 0 else 0
            assert 0 <= ahead <= book, f"{name}: agent ahead {ahead} outside [0, {book}]"
        bid_prices = [p for p, queue in enumerate(self.queues[BUY]) if queue]
        ask_prices = [p for p, queue in enumerate(self.queues[SELL]) if queue]
        if bid_prices and ask_prices:
            assert max(bid_prices) < min(ask_prices), (
                f"crossed or locked book: best bid {max(bid_prices)} >= best ask {min(ask_prices)}"
            )
        for counter in ("overflow", "traded", "background_cancelled", "background_traded"):
            assert getattr(self, counter) >= 0, f"{counter} = {getattr(self, counter)} < 0"
        resting = sum(self.bid_totals()) + sum(self.ask_totals())
        accounted = resting + self.background_cancelled + self.background_traded
        assert self.background_added == accounted, (
            f"background lots not conserved: added {self.background_added} != resting {resting}"
            f" + cancelled {self.background_cancelled} + traded {self.background_traded}"
        )
        self._audit_fills()

    def _audit_fills(self) -> None:
        """Rebuild traded, inventory and cash from the fills since the last check."""
        for fill in self._unchecked_fills:
            assert fill.qty > 0, f"fill with qty <= 0: {fill}"
            assert fill.side in (BUY, SELL), f"fill with bad side: {fill}"
            assert 0 <= fill.price < self.price_levels, f"fill outside the window: {fill}"
            value = fill.qty * (self.base + fill.price)
            self._audit_traded += fill.qty
            sides = ((fill.aggressor_owner, fill.side), (fill.resting_owner, -fill.side))
            for owner, sign in sides:
                assert owner in (BACKGROUND, AGENT), f"fill with bad owner: {fill}"
                if owner == AGENT:
                    self._audit_inventory += sign * fill.qty
                    self._audit_cash -= sign * value
        self._unchecked_fills.clear()
        assert self.traded == self._audit_traded, (
            f"traded {self.traded} != sum of fill qty {self._audit_traded}"
        )
        assert self.inventory == self._audit_inventory, (
            f"inventory {self.inventory} != signed sum of agent fills {self._audit_inventory}"
        )
        assert self.cash == self._audit_cash, (
            f"cash {self.cash} != minus signed sum of agent fill values {self._audit_cash}"
        )
