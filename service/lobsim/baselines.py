"""The baseline market makers a trained LobSim policy is compared with (`trident eval`, the main
job's evaluation): hold, uniformly random actions, always QUOTE(0,0), an inventory-skew rule and
Avellaneda–Stoikov (2008). Each reads what it needs from the env it plays (books, inventory,
steps left), not from the observation; a policy maps (observations, action mask) to actions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.lobsim.book import ASK, BID
from service.lobsim.env import NUM_ACTIONS, QUOTES, LobSim

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs, action mask) -> actions
PolicyFactory = Callable[[LobSim], Policy]  # a policy for the markets it will play

# Avellaneda–Stoikov defaults (see `avellaneda_stoikov_actions`), used where no tuning ran.
# γ, risk aversion per tick·lot: at LobSim's typical variance (about 0.005 ticks² per step) and
# 400 steps to go, each lot of inventory moves the reservation price by γσ²(T − t) ≈ 0.6 tick.
# k, the decay per tick of the fill intensity λ(δ) = A·exp(−kδ). Together, with no inventory,
# the quotes sit γσ²(T − t)/2 + (1/γ)·ln(1 + γ/k) ≈ 0.9 tick from the mid: QUOTE(0,0).
AS_GAMMA = 0.3
AS_K = 1.5
# The σ² Avellaneda–Stoikov reads: realised variance of the mid's per-step changes over the
# episode so far, shrunk towards a prior worth AS_PRIOR_STEPS steps,
#     σ̂²_t = (n0·σ0² + Σ_{s<t} Δmid_s²) / (n0 + t).
# Why not the env's EMA(0.9) of Δmid²: the mid moves in about 1 % of steps (by ½ or 1 tick), so
# an EMA that forgets a move within ~20 steps reads ~0 most of the time (median 3e-8 ticks² on
# the default markets) and AS then sees no inventory risk at all. σ0² is the pooled per-step
# variance measured on the default markets (0.003 under QUOTE(0,0), 0.006 under HOLD); n0 = 100
# steps holds about one move's worth of evidence, so a market's own moves take over within the
# episode while a calm stretch early on cannot drive σ̂² to 0.
AS_PRIOR_VARIANCE = 0.005  # ticks² per step
AS_PRIOR_STEPS = 100  # steps


def constant(action: int) -> Policy:
    return lambda obs, mask: np.full(obs.shape[0], action)


def uniform_random(seed: int) -> Policy:
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return rng.integers(0, NUM_ACTIONS, obs.shape[0])

    return act


def skew_actions(inventory: np.ndarray) -> np.ndarray:
    """The inventory-skew rule: flat -> QUOTE(0,0) (2); long -> QUOTE(2,0) (6: the bid two ticks
    behind, the ask at the touch, so sells fill first); short -> QUOTE(0,2) (5)."""
    inventory = np.asarray(inventory)
    return np.where(inventory > 0, 6, np.where(inventory < 0, 5, 2))


def inventory_skew(env: LobSim) -> Policy:
    """`skew_actions` on `env`'s inventories."""
    return lambda obs, mask: skew_actions(env.books.inventory)


def avellaneda_stoikov_actions(
    mid: np.ndarray,
    bid: np.ndarray,
    ask: np.ndarray,
    inventory: np.ndarray,
    variance: np.ndarray,
    steps_left: np.ndarray,
    gamma: float | np.ndarray = AS_GAMMA,
    k: float | np.ndarray = AS_K,
) -> np.ndarray:
    """The quote action nearest the Avellaneda–Stoikov (2008) quotes, per market.

    Prices in ticks, `variance` σ² in ticks² per step, `steps_left` T − t in steps, γ and k
    scalars or one per market:
        reservation price  r = s − q·γ·σ²·(T − t)
        total spread       δ = γ·σ²·(T − t) + (2/γ)·ln(1 + γ/k)
        quotes             r − δ/2 and r + δ/2
    Their distances behind the touches, (bid − (r − δ/2), (r + δ/2) − ask), are clipped to
    [0, 3] (a quote inside the spread joins the touch; 3 ticks is the farthest action) and the
    nearest (Euclidean) of QUOTE(0,0), (1,1), (3,3), (0,2), (2,0) is taken; a tie goes to the
    first in that order. A long inventory pushes both quotes down, towards (2, 0); a short one
    up, towards (0, 2); a high σ²·(T − t) widens both, towards (1, 1) and (3, 3).
    """
    risk = gamma * variance * steps_left  # γσ²(T − t)
    reservation = mid - inventory * risk
    half = (risk + 2.0 / gamma * np.log1p(gamma / k)) / 2.0
    behind = np.stack([bid - (reservation - half), reservation + half - ask], axis=1)
    options = np.array(list(QUOTES.values()), dtype=np.float64)  # [5, 2] ticks behind
    behind = np.clip(behind, 0.0, options.max())
    nearest = ((behind[:, None, :] - options[None]) ** 2).sum(axis=2).argmin(axis=1)
    return np.array(list(QUOTES))[nearest]


class AvellanedaStoikov:
    """An Avellaneda–Stoikov market maker on `env`'s markets: reads the books, the inventory
    and the steps left from the env, not from the observation, and estimates σ² itself (see
    AS_PRIOR_VARIANCE). `gamma` and `k`: one value, or one per market (the tuning grid)."""

    def __init__(
        self,
        env: LobSim,
        gamma: float | np.ndarray = AS_GAMMA,
        k: float | np.ndarray = AS_K,
        prior_variance: float = AS_PRIOR_VARIANCE,
        prior_steps: float = AS_PRIOR_STEPS,
    ) -> None:
        n = env.num_envs
        self.gamma = np.broadcast_to(np.asarray(gamma, dtype=np.float64), (n,)).copy()
        self.k = np.broadcast_to(np.asarray(k, dtype=np.float64), (n,)).copy()
        if not (np.isfinite(self.gamma).all() and (self.gamma > 0).all()):
            raise ValueError(f"gamma: expected finite values > 0, got {gamma}")
        if not (np.isfinite(self.k).all() and (self.k > 0).all()):
            raise ValueError(f"k: expected finite values > 0, got {k}")
        if not prior_variance > 0 or not prior_steps > 0:
            raise ValueError(f"prior_variance and prior_steps: expected > 0, got "
                             f"{prior_variance}, {prior_steps}")  # fmt: skip
        self.env, self.prior_variance, self.prior_steps = env, prior_variance, prior_steps
        self._squares = np.zeros(n)  # Σ Δmid² over the episode so far (ticks²)
        self._steps = 0  # mid changes seen this episode (every market starts together)
        self._last_mid = np.zeros(n)

    def variance(self) -> np.ndarray:
        """σ̂² per market: (n0·σ0² + Σ Δmid²) / (n0 + t), ticks² per step."""
        return (self.prior_steps * self.prior_variance + self._squares) / (
            self.prior_steps + self._steps
        )

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        env, books = self.env, self.env.books
        # the mid in absolute ticks: base moves with a re-centred window, mid2 against it
        mid = books.base + env.mid2 / 2.0
        if env.clock == 0:  # a new episode: its own realised variance only
            self._squares[...] = 0.0
            self._steps = 0
        else:
            self._squares += (mid - self._last_mid) ** 2
            self._steps += 1
        self._last_mid = mid
        bid, ask = books.best(BID), books.best(ASK)
        # an empty side's touch is taken next to the mid, as the env prices quotes
        bid = np.where(bid >= 0, bid, env.mid2 // 2)
        ask = np.where(ask >= 0, ask, (env.mid2 + 1) // 2)
        return avellaneda_stoikov_actions(
            env.mid2 / 2.0, bid, ask, books.inventory, self.variance(), env.cfg.horizon - env.t,
            self.gamma, self.k,
        )  # fmt: skip


def baselines(seed: int, gamma: float = AS_GAMMA, k: float = AS_K) -> dict[str, PolicyFactory]:
    """HOLD, uniformly random actions (seeded), always QUOTE(0,0), the inventory-skew rule and
    Avellaneda–Stoikov with (γ, k)."""
    return {
        "hold": lambda env: constant(0),
        "random": lambda env: uniform_random(seed),
        "quote(0,0)": lambda env: constant(2),
        "inventory-skew": inventory_skew,
        "avellaneda-stoikov": lambda env: AvellanedaStoikov(env, gamma, k),
    }
