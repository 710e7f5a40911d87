"""The matching core of N independent limit-order books, vectorised over the env axis.

The contract is `service/lobsim/SPEC.md`; `service/lobsim/reference.py` implements the same
contract one market at a time with explicit FIFO lists, and the tests check the two against
each other. Here each side of each book is an int64 row of background lots per price (no
per-order lists): time priority matters only around the agent's order, so a level is stored as
its background total plus, when the agent rests there, how much of it is ahead of the agent.

State arrays have a leading side axis (0 = bid, 1 = ask) where it applies, then the env axis.
`apply` takes one message per env (kind NONE for envs without one) and returns the fills in
execution order within each env.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

NONE, LIMIT, CANCEL, MARKET = 0, 1, 2, 3
BUY, SELL = 1, -1
BACKGROUND, AGENT = 0, 1
BID, ASK = 0, 1  # side axis of the state arrays

FILL_FIELDS = ("env", "seq", "aggressor", "resting", "side", "price", "qty")


@dataclass(frozen=True)
class Messages:
    """One message per env: int64 arrays [N] (see SPEC.md)."""

    kind: np.ndarray
    side: np.ndarray  # +1 buy, -1 sell
    owner: np.ndarray  # 0 background, 1 agent
    price: np.ndarray  # window index (LIMIT, CANCEL)
    qty: np.ndarray  # lots, > 0 where kind != NONE
    position: np.ndarray  # background CANCEL: first lot of the cancelled run


@dataclass(frozen=True)
class Fills:
    """Executions of one `apply`, each field an array [F]; ordered by env, then execution."""

    env: np.ndarray
    seq: np.ndarray
    aggressor: np.ndarray  # owner of the incoming order
    resting: np.ndarray  # owner of the resting lots
    side: np.ndarray  # side of the aggressor
    price: np.ndarray  # window index
    qty: np.ndarray


class Books:
    """N limit-order books over price windows [base, base + price_levels)."""

    def __init__(
        self, num_envs: int, price_levels: int, base: np.ndarray, xp: ModuleType = np
    ) -> None:
        if num_envs < 1 or price_levels < 2:
            raise ValueError(f"need num_envs >= 1 and price_levels >= 2, got {num_envs}, "
                             f"{price_levels}")  # fmt: skip
        self.num_envs, self.price_levels = num_envs, price_levels
        self.base = xp.asarray(base, dtype=np.int64).reshape(num_envs).copy()
        self.lots = xp.zeros((2, num_envs, price_levels), dtype=np.int64)  # background lots
        self.agent_px = xp.full((2, num_envs), -1, dtype=np.int64)
        self.agent_qty = xp.zeros((2, num_envs), dtype=np.int64)
        self.agent_ahead = xp.zeros((2, num_envs), dtype=np.int64)
        self.inventory = xp.zeros(num_envs, dtype=np.int64)
        self.cash = xp.zeros(num_envs, dtype=np.int64)
        self.overflow = xp.zeros(num_envs, dtype=np.int64)
        self.traded = xp.zeros(num_envs, dtype=np.int64)
        self._envs = xp.arange(num_envs)
        self.xp = xp  # numpy, or cupy for the device market (apply() is the host engine)

    # ----------------------------------------------------------------------------- queries
    def best(self, side: int) -> np.ndarray:
        """[N] best price index of `side` (BID / ASK) over background and agent lots (-1 where
        that side is empty)."""
        xp = self.xp
        held = self.lots[side] > 0
        if side == BID:
            index = self.price_levels - 1 - xp.argmax(held[:, ::-1], axis=1)
        else:
            index = xp.argmax(held, axis=1)
        background = xp.where(held[self._envs, index], index, -1)
        agent = self.agent_px[side]
        if side == BID:
            return xp.maximum(background, agent)
        return xp.where(background < 0, agent, xp.where(agent < 0, background,
                                                        xp.minimum(background, agent)))  # fmt: skip

    # ----------------------------------------------------------------------------- messages
    def apply(self, messages: Messages, seq: int) -> Fills:
        """Apply one message per env; returns the fills, in execution order within each env."""
        kind, side, owner = messages.kind, messages.side, messages.owner
        price, qty = messages.price, messages.qty
        in_window = (price >= 0) & (price < self.price_levels)
        limit = kind == LIMIT
        self.overflow += limit & ~in_window
        limit &= in_window

        # CANCEL, and the agent's LIMIT replacing its order on that side.
        self._cancel_agent((kind == CANCEL) & (owner == AGENT) | limit & (owner == AGENT), side)
        self._cancel_background((kind == CANCEL) & (owner == BACKGROUND), messages)

        # Matching: MARKET against anything, LIMIT against crossing prices.
        remaining = np.where((kind == MARKET) | limit, qty, 0).astype(np.int64)
        bound = np.where(limit, price, np.where(side == BUY, self.price_levels - 1, 0))
        pieces = self._match(remaining, side, owner, bound)

        # LIMIT remainders rest: background at the back of the queue, the agent behind them.
        rests = limit & (remaining > 0)
        own = np.where(side == BUY, BID, ASK)
        bg = rests & (owner == BACKGROUND)
        self.lots[own[bg], self._envs[bg], price[bg]] += remaining[bg]
        ag = rests & (owner == AGENT)
        self.agent_px[own[ag], self._envs[ag]] = price[ag]
        self.agent_qty[own[ag], self._envs[ag]] = remaining[ag]
        self.agent_ahead[own[ag], self._envs[ag]] = self.lots[own[ag], self._envs[ag], price[ag]]
        return self._fills(pieces, seq)

    def _cancel_agent(self, mask: np.ndarray, side: np.ndarray) -> None:
        own = np.where(side == BUY, BID, ASK)[mask]
        envs = self._envs[mask]
        self.agent_px[own, envs] = -1
        self.agent_qty[own, envs] = 0
        self.agent_ahead[own, envs] = 0

    def _cancel_background(self, mask: np.ndarray, messages: Messages) -> None:
        """Remove background lots [u, u + c) of the queue at the price (clipped)."""
        mask = mask & (messages.price >= 0) & (messages.price < self.price_levels)
        own = np.where(messages.side == BUY, BID, ASK)[mask]
        envs, p = self._envs[mask], messages.price[mask]
        start, count = messages.position[mask], messages.qty[mask]
        held = self.lots[own, envs, p]
        removed = np.clip(np.minimum(count, held - start), 0, None)
        self.lots[own, envs, p] = held - removed
        agent_here = self.agent_px[own, envs] == p
        ahead = self.agent_ahead[own, envs]
        before_agent = np.clip(np.minimum(start + removed, ahead) - start, 0, None)
        self.agent_ahead[own, envs] = np.where(agent_here, ahead - before_agent, ahead)

    def _match(
        self, remaining: np.ndarray, side: np.ndarray, owner: np.ndarray, bound: np.ndarray
    ) -> list[tuple[np.ndarray, ...]]:
        """Trade `remaining` lots (updated in place) against the opposite sides, best price
        outward, FIFO within a price. Returns the executed pieces, in order."""
        opposite = np.where(side == BUY, ASK, BID)
        pieces: list[tuple[np.ndarray, ...]] = []
        step = 0
        while True:
            best = np.where(side == BUY, self.best(ASK), self.best(BID))
            crosses = (best >= 0) & np.where(side == BUY, best <= bound, best >= bound)
            active = (remaining > 0) & crosses
            if not active.any():
                return pieces
            envs, opp, p = self._envs[active], opposite[active], best[active]
            rem = remaining[active]
            agent_here = self.agent_px[opp, envs] == p
            lots = self.lots[opp, envs, p]
            # 1. background lots ahead of the agent (all of them where the agent is not here)
            first = np.minimum(rem, np.where(agent_here, self.agent_ahead[opp, envs], lots))
            lots = lots - first
            rem = rem - first
            self.agent_ahead[opp, envs] -= np.where(agent_here, first, 0)
            # 2. the agent's order
            second = np.where(agent_here, np.minimum(rem, self.agent_qty[opp, envs]), 0)
            rem = rem - second
            left = self.agent_qty[opp, envs] - second
            self.agent_qty[opp, envs] = np.where(agent_here, left, self.agent_qty[opp, envs])
            gone = agent_here & (left == 0)
            self.agent_px[opp[gone], envs[gone]] = -1
            self.agent_ahead[opp[gone], envs[gone]] = 0
            # 3. background lots behind the agent
            third = np.where(agent_here, np.minimum(rem, lots), 0)
            lots = lots - third
            rem = rem - third
            self.lots[opp, envs, p] = lots
            remaining[active] = rem
            for part, lots_taken, resting in (
                (0, first, BACKGROUND),
                (1, second, AGENT),
                (2, third, BACKGROUND),
            ):
                took = lots_taken > 0
                e = envs[took]
                pieces.append(
                    (
                        e,
                        np.full(e.size, 3 * step + part),
                        owner[e],
                        np.full(e.size, resting),
                        side[e],
                        p[took],
                        lots_taken[took],
                    )
                )
            step += 1

    def _fills(self, pieces: list[tuple[np.ndarray, ...]], seq: int) -> Fills:
        """Order the pieces by env then execution, and book them to the agent's account."""
        if pieces:
            env, order, aggressor, resting, side, price, qty = (
                np.concatenate([piece[i] for piece in pieces]) for i in range(7)
            )
        else:
            env = order = aggressor = resting = side = price = qty = np.zeros(0, dtype=np.int64)
        sort = np.lexsort((order, env))
        env, aggressor, resting = env[sort], aggressor[sort], resting[sort]
        side, price, qty = side[sort], price[sort], qty[sort]
        value = qty * (self.base[env] + price)
        # The aggressor buys when side = +1; the resting owner takes the other side.
        signed = side * qty
        np.add.at(self.inventory, env[aggressor == AGENT], signed[aggressor == AGENT])
        np.add.at(self.cash, env[aggressor == AGENT], -(side * value)[aggressor == AGENT])
        np.add.at(self.inventory, env[resting == AGENT], -signed[resting == AGENT])
        np.add.at(self.cash, env[resting == AGENT], (side * value)[resting == AGENT])
        np.add.at(self.traded, env, qty)
        return Fills(
            env=env,
            seq=np.full(env.size, seq, dtype=np.int64),
            aggressor=aggressor.astype(np.int64),
            resting=resting.astype(np.int64),
            side=side.astype(np.int64),
            price=price.astype(np.int64),
            qty=qty.astype(np.int64),
        )
