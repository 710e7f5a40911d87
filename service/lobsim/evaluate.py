"""Policies on held-out LobSim markets: whole episodes, their metrics, baselines, a table and a
plot (`trident eval`).

Every policy of one comparison plays the same seed on fresh markets, so the background flow's
random draws are the same for all of them; only the agent's orders differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.config import LobsimConfig
from service.lobsim.book import ASK, BID
from service.lobsim.env import NUM_ACTIONS, QUOTES, LobSim

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs, action mask) -> actions
PolicyFactory = Callable[[LobSim], Policy]  # a policy for the markets it will play

# Avellaneda–Stoikov defaults (see `avellaneda_stoikov_actions`). γ, risk aversion per tick·lot:
# at LobSim's typical realised variance (about 0.005 ticks² per step) and 400 steps to go, each
# lot of inventory moves the reservation price by γσ²(T − t) ≈ 0.6 tick. k, the decay per tick of
# the fill intensity λ(δ) = A·exp(−kδ): LobSim's spread is nearly always one tick and a quote
# behind the touch fills only once the touch is eaten, so fills fall off steeply with distance.
# Together, with no inventory and a calm mid, the quotes sit (1/γ)·ln(1 + γ/k) ≈ 0.61 tick from
# the mid, at the touches: QUOTE(0,0).
AS_GAMMA = 0.3
AS_K = 1.5


@dataclass(frozen=True)
class Trace:
    """One episode of N markets: per step [horizon, N], as the env reported it at the end of
    that step (the last step's after liquidation, before the reset), and returns [N]."""

    pnl: np.ndarray  # cash + inventory · mid (ticks)
    inventory: np.ndarray  # lots; 0 at the last step (liquidated)
    taken: np.ndarray  # lots the agent's orders took from the book
    passive: np.ndarray  # lots of the agent's resting quotes filled
    reward: np.ndarray
    episode_return: np.ndarray


@dataclass(frozen=True)
class Interval:
    """A mean with the half-width of its 95 % interval (normal approximation)."""

    mean: float
    half: float

    def __str__(self) -> str:
        return f"{self.mean:9.2f} ± {self.half:6.2f}"


def interval(values: np.ndarray) -> Interval:
    """Mean ± 1.96 standard errors of `values` (half-width 0 for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    half = 1.96 * values.std(ddof=1) / np.sqrt(values.size) if values.size > 1 else 0.0
    return Interval(float(values.mean()), float(half))


def summary(returns: np.ndarray) -> str:
    """mean ± 95 % interval of per-episode returns."""
    return str(interval(returns))


# ------------------------------------------------------------------------------ episodes
def play_episode(env: LobSim, policy: Policy) -> Trace:
    """One whole episode of `env`'s markets (all at their first step) under `policy`."""
    if (env.t != 0).any():
        raise ValueError("play_episode: every market must be at the start of an episode")
    obs = env.reset()
    steps = []
    for _ in range(env.cfg.horizon):
        out = env.step(policy(obs, env.action_mask()))
        info = out.info
        steps.append(
            (info["pnl"], info["inventory"], info["agent_taken"], info["agent_passive"], out.reward)
        )
        obs = out.obs
    if not out.terminated.all():
        raise RuntimeError("an episode did not end after lobsim.horizon steps")
    columns = (np.stack(column) for column in zip(*steps, strict=True))
    return Trace(*columns, episode_return=info["episode_return"].copy())


def episode_returns(policy: Policy, cfg: LobsimConfig, seed: int, num_envs: int) -> np.ndarray:
    """One full episode of `num_envs` markets (seed `seed`) under `policy`: return per env."""
    return play_episode(LobSim(num_envs, cfg, seed), policy).episode_return


def play_all(
    policies: Mapping[str, PolicyFactory], cfg: LobsimConfig, seed: int, num_envs: int
) -> dict[str, Trace]:
    """One episode of the same `num_envs` fresh markets (seed `seed`) per policy."""
    traces = {}
    for name, make in policies.items():
        env = LobSim(num_envs, cfg, seed)
        traces[name] = play_episode(env, make(env))
    return traces


# ------------------------------------------------------------------------------ policies
def constant(action: int) -> Policy:
    return lambda obs, mask: np.full(obs.shape[0], action)


def uniform_random(seed: int) -> Policy:
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return rng.integers(0, NUM_ACTIONS, obs.shape[0])

    return act


def avellaneda_stoikov_actions(
    mid: np.ndarray,
    bid: np.ndarray,
    ask: np.ndarray,
    inventory: np.ndarray,
    variance: np.ndarray,
    steps_left: np.ndarray,
    gamma: float = AS_GAMMA,
    k: float = AS_K,
) -> np.ndarray:
    """The quote action nearest the Avellaneda–Stoikov (2008) quotes, per market.

    Prices in ticks, `variance` σ² in ticks² per step, `steps_left` T − t in steps:
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
    """An Avellaneda–Stoikov market maker on `env`'s markets: reads the books, the inventory,
    the realised variance (the env's EMA of squared mid changes) and the steps left from the
    env, not from the observation."""

    def __init__(self, env: LobSim, gamma: float = AS_GAMMA, k: float = AS_K) -> None:
        if gamma <= 0 or k <= 0:
            raise ValueError(f"gamma and k must be > 0, got {gamma}, {k}")
        self.env, self.gamma, self.k = env, gamma, k

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        env, books = self.env, self.env.books
        bid, ask = books.best(BID), books.best(ASK)
        # an empty side's touch is taken next to the mid, as the env prices quotes
        bid = np.where(bid >= 0, bid, env.mid2 // 2)
        ask = np.where(ask >= 0, ask, (env.mid2 + 1) // 2)
        return avellaneda_stoikov_actions(
            env.mid2 / 2.0, bid, ask, books.inventory, env.variance, env.cfg.horizon - env.t,
            self.gamma, self.k,
        )  # fmt: skip


def baselines(seed: int) -> dict[str, PolicyFactory]:
    """HOLD, uniformly random actions (seeded), always QUOTE(0,0), Avellaneda–Stoikov."""
    return {
        "hold": lambda env: constant(0),
        "random": lambda env: uniform_random(seed),
        "quote(0,0)": lambda env: constant(2),
        "avellaneda-stoikov": AvellanedaStoikov,
    }


# ------------------------------------------------------------------------------ metrics
def sharpe(pnl: np.ndarray) -> np.ndarray:
    """Per market: mean / std of the per-step PnL changes × √steps (0 where PnL never moves)."""
    increments = np.diff(pnl, axis=0, prepend=0.0)  # PnL starts at 0
    std = increments.std(axis=0, ddof=1)
    ratio = increments.mean(axis=0) / np.where(std > 0, std, 1.0) * np.sqrt(pnl.shape[0])
    return np.where(std > 0, ratio, 0.0)


def metrics(trace: Trace) -> dict[str, Interval]:
    """Per-episode metrics as mean ± 95 % interval over the markets."""
    return {
        "final PnL": interval(trace.pnl[-1]),
        "Sharpe": interval(sharpe(trace.pnl)),
        "mean |inv|": interval(np.abs(trace.inventory).mean(axis=0)),
        "taker lots": interval(trace.taken.sum(axis=0)),
        "passive lots": interval(trace.passive.sum(axis=0)),
        "return": interval(trace.episode_return),
    }


def table(results: Mapping[str, Mapping[str, Interval]]) -> str:
    """One row per policy, one `mean ± CI` column per metric."""
    names = list(next(iter(results.values())))
    width = max(len("policy"), *map(len, results))
    lines = [f"{'policy':<{width}} " + " ".join(f"{name:>18}" for name in names)]
    for policy, row in results.items():
        lines.append(f"{policy:<{width}} " + " ".join(f"{row[name]!s:>18}" for name in names))
    return "\n".join(lines)


def plot(traces: Mapping[str, Trace], path: Path, title: str) -> None:
    """PNG: mean PnL and mean |inventory| over the markets against the step, one line per
    policy (both start at 0 before the first step)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 6))
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True)
    for name, trace in traces.items():
        steps = np.arange(trace.pnl.shape[0] + 1)
        top.plot(steps, np.concatenate([[0.0], trace.pnl.mean(axis=1)]), label=name)
        bottom.plot(steps, np.concatenate([[0.0], np.abs(trace.inventory).mean(axis=1)]))
    top.set_ylabel("mean PnL (ticks)")
    top.legend(fontsize="small")
    bottom.set_ylabel("mean |inventory| (lots)")
    bottom.set_xlabel("step")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
