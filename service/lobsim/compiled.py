"""LobSim's market step on the host, compiled by Numba: kernels/lobsim.cu's per-market loop.

The NumPy engine (`LobSim._events`) runs each background event as one vectorised
`Books.apply` over all N markets, so at the main job's N = 256 a step is some thousands of
NumPy calls on small arrays and costs their per-call overhead. This module runs the CUDA
kernel's loop instead, market after market: the agent's messages at their latency slot and
`events` background events, each market keeping its background totals, best and lowest
prices as it writes its rows (kernels/lobsim.cu's `lob_set_lots`). The integer arithmetic is
the kernel's and the NumPy engine's, so one seed gives byte-identical books on all three
(tests/lobsim/test_compiled.py, tests/lobsim/test_kernel_on_host.py). The Philox words come
from `service.backend.philox` (NumPy), the same words the other engines draw.

`CompiledMarket` is a `MarketKernel` (env.py); `available()` says whether Numba imports, and
LobSim falls back to the NumPy engine where it does not. The first step compiles the loop
(cached on disk beside this file, or in NUMBA_CACHE_DIR, for later processes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.backend.philox import Stream, random_bits, random_bits_span
from service.lobsim.book import Books, Messages

try:
    import numba
except ImportError:  # the NumPy engine runs the markets
    numba = None

FIELDS = ("kind", "side", "owner", "price", "qty", "position")  # cuda_market.FIELDS

# Message kinds and owners (book.py).
_LIMIT, _CANCEL, _MARKET, _AGENT = 1, 2, 3, 1
# Accounts of one market while it steps, slots of `acct`.
_INVENTORY, _CASH, _OVERFLOW, _TRADED, _TAKEN, _PASSIVE, _FLOW = range(7)


def available() -> bool:
    """Whether Numba imports here (else LobSim runs the NumPy engine)."""
    return numba is not None


def _jit(function: Any) -> Any:
    return numba.njit(cache=True, nogil=True)(function) if numba is not None else function


@_jit
def _scan(row: np.ndarray, start: int, step: int) -> int:
    """The first price with lots in `row` from `start` on, going by `step`; -1: none."""
    p = start
    while 0 <= p < row.shape[0]:
        if row[p] > 0:
            return p
        p += step
    return -1


@_jit
def _set_lots(
    rows: np.ndarray, n: int, side: int, price: int, lots: int, total: np.ndarray,
    best: np.ndarray, lowest: np.ndarray,
) -> None:  # fmt: skip
    """rows[side, n, price] = lots, keeping the market's total, best and lowest exact."""
    row = rows[side, n]
    total[side] += lots - row[price]
    row[price] = lots
    inward = -1 if side == 0 else 1  # from the best price into the book
    if lots > 0:
        if best[side] < 0 or (price > best[side] if side == 0 else price < best[side]):
            best[side] = price
        if lowest[side] < 0 or price < lowest[side]:
            lowest[side] = price
    else:
        if price == best[side]:
            best[side] = _scan(row, price + inward, inward)
        if price == lowest[side]:
            lowest[side] = _scan(row, price + 1, 1)


@_jit
def _best(background: np.ndarray, agent_px: np.ndarray, n: int, side: int) -> int:
    """Books.best for one market: the best price over background and agent lots (-1: empty)."""
    bg, agent = background[side], agent_px[side, n]
    if side == 0:
        return max(bg, agent)
    if bg < 0:
        return agent
    if agent < 0:
        return bg
    return min(bg, agent)


@_jit
def _fill(acct: np.ndarray, base: int, aggressor: int, resting: int, side: int, price: int,
          qty: int) -> None:  # fmt: skip
    """One execution: the agent's account, traded, and its taken / passive / flow counters."""
    value = qty * (base + price)
    signed = side * qty
    if aggressor == _AGENT:
        acct[_INVENTORY] += signed
        acct[_CASH] -= side * value
        acct[_TAKEN] += qty
    if resting == _AGENT:
        acct[_INVENTORY] -= signed
        acct[_CASH] += side * value
        acct[_PASSIVE] += qty
    acct[_TRADED] += qty
    acct[_FLOW] += side * qty


@_jit
def _apply(
    rows: np.ndarray, agent_px: np.ndarray, agent_qty: np.ndarray, agent_ahead: np.ndarray,
    n: int, base: int, total: np.ndarray, best: np.ndarray, lowest: np.ndarray,
    acct: np.ndarray, kind: int, side: int, owner: int, price: int, qty: int, position: int,
) -> None:  # fmt: skip
    """Books.apply for one message of market n (kernels/lobsim.cu `lob_apply`)."""
    P = rows.shape[2]
    in_window = 0 <= price < P
    limit = kind == _LIMIT
    if limit and not in_window:
        acct[_OVERFLOW] += 1
    limit = limit and in_window
    own = 0 if side == 1 else 1
    if (kind == _CANCEL and owner == _AGENT) or (limit and owner == _AGENT):
        agent_px[own, n] = -1
        agent_qty[own, n] = 0
        agent_ahead[own, n] = 0
    if kind == _CANCEL and owner != _AGENT and in_window:
        held = rows[own, n, price]
        removed = max(min(held - position, qty), 0)
        _set_lots(rows, n, own, price, held - removed, total, best, lowest)
        if agent_px[own, n] == price:
            ahead = agent_ahead[own, n]
            agent_ahead[own, n] = ahead - max(min(position + removed, ahead) - position, 0)
    if kind == _MARKET or limit:
        # Books._match: best price outward, FIFO within a price (background lots ahead of
        # the agent, the agent's order, the lots behind it).
        bound = price if limit else (P - 1 if side == 1 else 0)
        opp = 1 if side == 1 else 0  # a buy meets asks, a sell meets bids
        remaining = qty
        while remaining > 0:
            at = _best(best, agent_px, n, opp)
            if at < 0 or (at > bound if side == 1 else at < bound):
                break
            agent_here = agent_px[opp, n] == at
            lots = rows[opp, n, at]
            first = min(remaining, agent_ahead[opp, n] if agent_here else lots)
            lots -= first
            remaining -= first
            second = 0
            third = 0
            if agent_here:
                agent_ahead[opp, n] -= first
                second = min(remaining, agent_qty[opp, n])
                remaining -= second
                agent_qty[opp, n] -= second
                if agent_qty[opp, n] == 0:
                    agent_px[opp, n] = -1
                    agent_ahead[opp, n] = 0
                third = min(remaining, lots)
                lots -= third
                remaining -= third
            _set_lots(rows, n, opp, at, lots, total, best, lowest)
            if first > 0:
                _fill(acct, base, owner, 0, side, at, first)
            if second > 0:
                _fill(acct, base, owner, _AGENT, side, at, second)
            if third > 0:
                _fill(acct, base, owner, 0, side, at, third)
        if limit and remaining > 0:
            if owner == _AGENT:
                agent_px[own, n] = price
                agent_qty[own, n] = remaining
                agent_ahead[own, n] = rows[own, n, price]
            else:
                _set_lots(rows, n, own, price, rows[own, n, price] + remaining, total, best,
                          lowest)  # fmt: skip


@_jit
def _below(word: np.uint32, n: int) -> int:
    """⌊w · n / 2³²⌋ (philox.below)."""
    return np.int64((np.uint64(word) * np.uint64(n)) >> np.uint64(32))


@_jit
def _step(
    rows: np.ndarray, agent_px: np.ndarray, agent_qty: np.ndarray, agent_ahead: np.ndarray,
    inventory: np.ndarray, cash: np.ndarray, overflow: np.ndarray, traded: np.ndarray,
    base: np.ndarray, limit_w: np.ndarray, cancel_w: np.ndarray, market_w: np.ndarray,
    excitation: np.ndarray, direction: np.ndarray, msg: np.ndarray, latency: np.ndarray,
    words: np.ndarray, informed_words: np.ndarray, taken: np.ndarray, passive: np.ndarray,
    flow: np.ndarray, max_order_lots: int, hawkes: bool, hawkes_jump: int,
    hawkes_decay_pct: int, informed_pct: int, flip_permille: int,
) -> None:  # fmt: skip
    """kernels/lobsim.cu `lobsim_step`, one market after another."""
    N, P = rows.shape[1], rows.shape[2]
    D = limit_w.shape[1]
    events = words.shape[0]
    total = np.zeros(2, dtype=np.int64)
    best = np.zeros(2, dtype=np.int64)
    lowest = np.zeros(2, dtype=np.int64)
    acct = np.zeros(7, dtype=np.int64)
    for n in range(N):
        base_n = base[n]
        acct[_INVENTORY], acct[_CASH] = inventory[n], cash[n]
        acct[_OVERFLOW], acct[_TRADED] = overflow[n], traded[n]
        acct[_TAKEN] = acct[_PASSIVE] = acct[_FLOW] = 0
        for side in range(2):
            total[side] = rows[side, n].sum()
            best[side] = _scan(rows[side, n], P - 1, -1) if side == 0 else _scan(rows[1, n], 0, 1)
            lowest[side] = _scan(rows[side, n], 0, 1)
        limit_total = limit_w[n].sum()
        excite = excitation[n]
        hidden = direction[n]  # informed flow's direction: +1 up, -1 down
        for slot in range(events + 1):
            if latency[n] == slot:
                for k in range(2):
                    _apply(rows, agent_px, agent_qty, agent_ahead, n, base_n, total, best,
                           lowest, acct, msg[k, 0, n], msg[k, 1, n], msg[k, 2, n],
                           msg[k, 3, n], msg[k, 4, n], msg[k, 5, n])  # fmt: skip
            if slot == events:
                break
            informed_side = 0  # the side an informed market order takes; 0: uninformed
            if informed_pct > 0:
                # The direction steers background market orders only, so flipping it here,
                # after slot 0's agent messages, is the NumPy engine's flip at the step's start.
                if slot == 0 and _below(informed_words[0, n, 1], 1000) < flip_permille:
                    hidden = -hidden
                if _below(informed_words[slot, n, 0], 100) < informed_pct:
                    informed_side = hidden
            bid_total, ask_total = total[0], total[1]
            market = market_w[n] + excite
            weight = 2 * limit_total + 2 * market + cancel_w[n] * (bid_total + ask_total)
            pick = _below(words[slot, n, 0], weight)
            size = 1 + _below(words[slot, n, 1], max_order_lots)
            kind, side, price, position = _CANCEL, 1, 0, 0
            if pick < 2 * limit_total:
                sell = pick >= limit_total
                offset = pick - limit_total if sell else pick
                running, distance = 0, 0
                for d in range(D):
                    running += limit_w[n, d]
                    if running > offset:
                        distance = d
                        break
                best_bid, best_ask = _best(best, agent_px, n, 0), _best(best, agent_px, n, 1)
                centre = P // 2
                buy_anchor = best_ask - 1 if best_ask >= 0 else (best_bid if best_bid >= 0
                                                                 else centre)  # fmt: skip
                sell_anchor = best_bid + 1 if best_bid >= 0 else (best_ask if best_ask >= 0
                                                                  else centre)  # fmt: skip
                kind = _LIMIT
                side = -1 if sell else 1
                price = sell_anchor + distance if sell else buy_anchor - distance
            else:
                rest = pick - 2 * limit_total
                if rest < 2 * market:
                    kind = _MARKET
                    side = -1 if rest >= market else 1
                    if informed_side != 0:
                        side = informed_side
                else:
                    lot = (rest - 2 * market) // max(cancel_w[n], 1)
                    on_ask = 1 if lot >= bid_total else 0
                    in_side = lot - bid_total if on_ask else lot
                    row = rows[on_ask, n]
                    running, level = 0, 0
                    # the levels below `lowest` hold no lots
                    start = P if lowest[on_ask] < 0 else lowest[on_ask]
                    for p in range(start, P):
                        if running + row[p] > in_side:
                            level = p
                            break
                        running += row[p]
                    side = -1 if on_ask else 1
                    price = level
                    position = in_side - running
            _apply(rows, agent_px, agent_qty, agent_ahead, n, base_n, total, best, lowest,
                   acct, kind, side, 0, price, size, position)  # fmt: skip
            if hawkes:
                excite = excite * hawkes_decay_pct // 100 + (hawkes_jump if kind == _MARKET
                                                             else 0)  # fmt: skip
        inventory[n], cash[n] = acct[_INVENTORY], acct[_CASH]
        overflow[n], traded[n] = acct[_OVERFLOW], acct[_TRADED]
        excitation[n] = excite
        direction[n] = hidden
        taken[n], passive[n], flow[n] = acct[_TAKEN], acct[_PASSIVE], acct[_FLOW]


class CompiledMarket:
    """CudaMarket's interface (service/lobsim/cuda_market.py) over NumPy books, by the loop
    above; its random bits are NumPy's Philox words."""

    def __init__(self, key: tuple[int, int]) -> None:
        if numba is None:
            raise RuntimeError("CompiledMarket needs Numba (pip install numba)")
        self._key = key
        self._no_informed = np.zeros((0, 0, 4), dtype=np.uint32)

    def random_bits(self, stream: Stream, sequence: int, n: int) -> np.ndarray:
        """Philox words [n, 4] uint32 of `sequence` in `stream` (philox.random_bits)."""
        return random_bits(self._key, stream, sequence, n)

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
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step's events; updates `books`, `excitation` and the informed flow's hidden
        `direction` in place and returns the agent's taken and passive lots and the signed
        flow per market."""
        N = books.num_envs
        max_order_lots, hawkes, jump, decay_pct, informed_pct, flip_permille = flow_settings
        msg = np.array([[getattr(m, f) for f in FIELDS] for m in messages], dtype=np.int64)
        limit_w, cancel_w, market_w = (np.ascontiguousarray(w, dtype=np.int64) for w in weights)
        words = random_bits_span(self._key, Stream.LOB_FLOW, first_seq, events, N)
        informed = (
            random_bits_span(self._key, Stream.LOB_INFORMED, first_seq, events, N)
            if informed_pct
            else self._no_informed
        )
        taken, passive, flow = (np.zeros(N, dtype=np.int64) for _ in range(3))
        _step(
            books.lots, books.agent_px, books.agent_qty, books.agent_ahead, books.inventory,
            books.cash, books.overflow, books.traded, books.base, limit_w, cancel_w, market_w,
            excitation, direction, msg, np.ascontiguousarray(latency, dtype=np.int64), words,
            informed, taken, passive, flow, int(max_order_lots), bool(hawkes), int(jump),
            int(decay_pct), int(informed_pct), int(flip_permille),
        )  # fmt: skip
        return taken, passive, flow
