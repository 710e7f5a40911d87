"""Policies on held-out LobSim markets: whole episodes, their metrics, baselines, paired
differences, a table, a JSON file and a plot (`trident eval` and the main job's evaluation).

Every policy of one comparison plays the same seed on fresh markets, so the background flow's
random draws are the same for all of them; only the agent's orders differ. That makes the
per-market difference between two policies a paired sample: its interval is far narrower than
the difference of two independent intervals.

`compare` is the one entry point: it tunes Avellaneda–Stoikov on training seeds, plays the
trained policy (if any) and the baselines on the held-out seed, and returns a `Report`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from service.config import LobsimConfig
from service.jobs.progress import Phases
from service.lobsim.baselines import (
    AS_PRIOR_STEPS,
    AS_PRIOR_VARIANCE,
    AvellanedaStoikov,
    Policy,
    PolicyFactory,
    baselines,
)
from service.lobsim.env import LobSim

TRAINED = "trained (greedy-π)"  # the row of the policy under test
EVAL_MARKETS = 256  # held-out markets per policy (one episode each) by default
Z95 = 1.96  # two-sided 95 % quantile of the normal distribution
# written beside each other into out_dir: every number, the printed report, the plot
JSON_NAME, TEXT_NAME, PNG_NAME = "eval.json", "eval.txt", "eval.png"



@dataclass(frozen=True)
class ASGrid:
    """The (γ, k) grid `tune_avellaneda_stoikov` searches and its budget: every pair plays
    `markets_per_pair` training markets, all pairs in one vectorised LobSim (20 x 32 = 640
    markets by default: about 10 s on two cores for the default 400-step episodes). The
    defaults span γσ²(T − t) from about 0.06 to 6 ticks per lot at the start of a 400-step
    episode and a calm half-spread (1/γ)·ln(1 + γ/k) from about 0.1 to 3 ticks, i.e. every
    quote action."""

    gammas: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0, 3.0)  # 1 / (tick·lot)
    ks: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0)  # 1 / tick
    markets_per_pair: int = 32  # episodes per (γ, k) pair

    def __post_init__(self) -> None:
        for name in ("gammas", "ks"):
            values = getattr(self, name)
            if len(values) == 0 or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{name}: expected a non-empty list of finite numbers > 0, "
                                 f"got {values!r}")  # fmt: skip
        if self.markets_per_pair < 2:
            raise ValueError(
                f"markets_per_pair: expected an integer >= 2, got {self.markets_per_pair}"
            )

    @property
    def pairs(self) -> list[tuple[float, float]]:
        """Every (γ, k), γ-major."""
        return [(g, k) for g in self.gammas for k in self.ks]


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


# ------------------------------------------------------------------------------ intervals
@dataclass(frozen=True)
class Interval:
    """A mean over n markets with the half-width of its 95 % interval (normal approximation);
    NaN where the quantity is undefined (PnL / MAP of a policy that never holds inventory)."""

    mean: float
    half: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    def __str__(self) -> str:
        if not math.isfinite(self.mean):
            return "n/a"
        return f"{self.mean:.2f} ± {self.half:.2f}"

    def to_json(self) -> dict[str, float | int | None]:
        """{mean, half, n}; an undefined value as null (JSON has no NaN)."""
        finite = math.isfinite(self.mean) and math.isfinite(self.half)
        mean, half = (self.mean, self.half) if finite else (None, None)
        return {"mean": mean, "half": half, "n": self.n}


def _samples(values: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size < 2:
        raise ValueError(f"{name}: expected a 1-D array of >= 2 values (one per market), "
                         f"got shape {list(values.shape)}")  # fmt: skip
    if not np.isfinite(values).all():
        raise ValueError(f"{name}: expected finite values, got {values[~np.isfinite(values)][:3]}")
    return values


def interval(values: np.ndarray) -> Interval:
    """Mean ± 1.96 standard errors (sample std, ddof 1) of `values`, one per market."""
    values = _samples(values, "values")
    half = Z95 * values.std(ddof=1) / np.sqrt(values.size)
    return Interval(float(values.mean()), float(half), values.size)


def paired_difference(a: np.ndarray, b: np.ndarray) -> Interval:
    """Mean ± 95 % interval of the per-market difference a − b (both played the same markets)."""
    a, b = _samples(a, "a"), _samples(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b: expected one value per market each, got {a.size} and {b.size}")
    return interval(a - b)


def ratio_of_means(numerator: np.ndarray, denominator: np.ndarray) -> Interval:
    """mean(numerator) / mean(denominator) ± 95 % interval by the delta method:
        R = ȳ / x̄,  se(R) = sd(y_i − R·x_i) / (√n · |x̄|).
    NaN where x̄ = 0 (the ratio is undefined, e.g. PnL / MAP of a policy that never trades)."""
    y, x = _samples(numerator, "numerator"), _samples(denominator, "denominator")
    if y.shape != x.shape:
        raise ValueError(f"numerator and denominator: expected one value per market each, "
                         f"got {y.size} and {x.size}")  # fmt: skip
    if x.mean() == 0:
        return Interval(math.nan, math.nan, y.size)
    ratio = y.mean() / x.mean()
    half = Z95 * (y - ratio * x).std(ddof=1) / (np.sqrt(y.size) * abs(x.mean()))
    return Interval(float(ratio), float(half), y.size)


# ------------------------------------------------------------------------------ episodes
def play_episode(env: LobSim, policy: Policy, phases: Phases | None = None) -> Trace:
    """One whole episode of `env`'s markets (all at their first step) under `policy`;
    `phases` moves by the markets' episodes as they go (N·t / horizon of them after step t:
    every market ends its episode at the last step together)."""
    if (env.t != 0).any():
        raise ValueError("play_episode: every market must be at the start of an episode")
    obs = env.reset()
    steps = []
    N, horizon = env.num_envs, env.cfg.horizon
    for t in range(horizon):
        out = env.step(policy(obs, env.action_mask()))
        if phases is not None:
            phases.advance(N * (t + 1) // horizon - N * t // horizon)
        info = out.info
        steps.append(
            (info["pnl"], info["inventory"], info["agent_taken"], info["agent_passive"], out.reward)
        )
        obs = out.obs
    if not out.terminated.all():
        raise RuntimeError("an episode did not end after lobsim.horizon steps")
    columns = (np.stack(column) for column in zip(*steps, strict=True))
    return Trace(*columns, episode_return=info["episode_return"].copy())


def play_all(
    policies: Mapping[str, PolicyFactory],
    cfg: LobsimConfig,
    seed: int,
    num_envs: int,
    phases: Phases | None = None,
) -> dict[str, Trace]:
    """One episode of the same `num_envs` fresh markets (seed `seed`) per policy; `phases`
    moves with them and ends a part per policy."""
    traces = {}
    for name, make in policies.items():
        env = LobSim(num_envs, cfg, seed)
        traces[name] = play_episode(env, make(env), phases)
        if phases is not None:
            phases.end(f"{name} played {num_envs} markets")
    return traces


# ------------------------------------------------------------------------------ tuning
@dataclass(frozen=True)
class ASTuning:
    """The grid search's outcome: the best (γ, k), its score (mean episode return over its
    markets ± 95 %; the best has the highest lower bound) and every pair's score, on training
    seed `seed`."""

    gamma: float
    k: float
    score: Interval
    seed: int
    grid: ASGrid
    scores: tuple[Interval, ...]  # one per grid.pairs entry

    def to_json(self) -> dict:
        return {
            "gamma": self.gamma,
            "k": self.k,
            "score": self.score.to_json(),
            "seed": self.seed,
            "markets_per_pair": self.grid.markets_per_pair,
            "prior_variance": AS_PRIOR_VARIANCE,
            "prior_steps": AS_PRIOR_STEPS,
            "grid": [
                {"gamma": g, "k": k, "score": score.to_json()}
                for (g, k), score in zip(self.grid.pairs, self.scores, strict=True)
            ],
        }


def tune_avellaneda_stoikov(
    cfg: LobsimConfig, seed: int, grid: ASGrid | None = None, phases: Phases | None = None
) -> ASTuning:
    """Grid search of Avellaneda–Stoikov's (γ, k) by episode return on training seed `seed`:
    one LobSim of len(grid.pairs) · markets_per_pair markets, pair p playing markets
    [p·m, (p + 1)·m). Markets are independent, so each pair's markets play exactly as they
    would in a LobSim of the same size and seed where every market used that pair.

    The pair with the highest lower 95 % bound (mean − half-width) wins, the first in grid
    order on a tie. Each pair plays different markets, so the highest of ~20 noisy means is
    biased upwards most where a pair's returns are most dispersed (the winner's curse); the
    lower bound discounts that. On the default markets the highest mean (γ 0.3, k 3: 10.4 ±
    5.4 on 32 training markets) returned 4.8 ± 3.1 on 128 held-out ones, the highest lower
    bound (γ 1, k 10: 7.2 ± 2.1) 6.4 ± 1.5. `phases` moves with the markets' episodes."""
    grid = grid or ASGrid()
    pairs, m = grid.pairs, grid.markets_per_pair
    gamma = np.repeat([g for g, _ in pairs], m)
    k = np.repeat([k for _, k in pairs], m)
    env = LobSim(len(pairs) * m, cfg, seed)
    returns = play_episode(env, AvellanedaStoikov(env, gamma, k), phases).episode_return
    scores = tuple(interval(r) for r in returns.reshape(len(pairs), m))
    best = int(np.argmax([s.low for s in scores]))
    return ASTuning(pairs[best][0], pairs[best][1], scores[best], seed, grid, scores)


# ------------------------------------------------------------------------------ metrics
def sharpe(pnl: np.ndarray) -> np.ndarray:
    """Per market: mean / std of the per-step PnL changes × √steps (0 where PnL never moves)."""
    increments = np.diff(pnl, axis=0, prepend=0.0)  # PnL starts at 0
    std = increments.std(axis=0, ddof=1)
    ratio = increments.mean(axis=0) / np.where(std > 0, std, 1.0) * np.sqrt(pnl.shape[0])
    return np.where(std > 0, ratio, 0.0)


def max_drawdown(pnl: np.ndarray) -> np.ndarray:
    """Per market: the largest fall of the PnL path [steps, N] from its running peak, the path
    starting at 0 before the first step (ticks, >= 0)."""
    path = np.concatenate([np.zeros((1, pnl.shape[1])), pnl], axis=0)
    return (np.maximum.accumulate(path, axis=0) - path).max(axis=0)


def mean_abs_inventory(inventory: np.ndarray) -> np.ndarray:
    """MAP per market: the mean |position| held through the episode's steps. The trace's last
    entry is 0 (liquidated), so this is also the mean over the positions each step began with."""
    return np.abs(inventory).mean(axis=0)


# column key: (header, legend)
METRICS = {
    "return": ("return", "the env's reward summed over the episode: final PnL less taker "
                         "fees, speculation damping and the inventory penalty, plus maker "
                         "rebates (ticks; the formula is below)"),
    "pnl": ("final PnL", "cash after liquidation at the far touch, fees not counted (ticks)"),
    "map": ("MAP", "mean |inventory| held per step (lots)"),
    "pnl_per_map": ("PnL/MAP", "mean final PnL / mean MAP over the markets (ratio of means, "
                               "delta-method interval; n/a where MAP is always 0)"),
    "sharpe": ("Sharpe", "per episode: mean / std of per-step PnL changes x sqrt(steps)"),
    "max_drawdown": ("max DD", "largest fall of the PnL path from its running peak (ticks)"),
    "taker_lots": ("taker lots", "lots the agent's market orders took"),
    "passive_lots": ("passive lots", "lots of the agent's resting quotes filled"),
}  # fmt: skip


def return_formula(cfg: LobsimConfig | None = None) -> str:
    """What the return subtracts from the final PnL, with `cfg`'s numbers (or the settings'
    names): the env's per-step reward (service/lobsim/env.py) summed over the episode, where
    the per-step Δ(cash + inventory·mid) sum to the final PnL."""
    fee, rebate, damping, penalty = (
        ("lobsim.taker_fee", "lobsim.maker_rebate", "lobsim.damping", "lobsim.inventory_penalty")
        if cfg is None
        else (f"{cfg.taker_fee:g}", f"{cfg.maker_rebate:g}", f"{cfg.damping:g}",
              f"{cfg.inventory_penalty:g}")
    )  # fmt: skip
    return (f"return = final PnL − {fee} × taker lots + {rebate} × passive lots − {damping} × "
            f"Σ max(0, inventory × Δmid) − {penalty} × Σ inventory², sums over the episode's "
            "steps")  # fmt: skip


def columns_help(width: int = 79) -> str:
    """Each column of the table, for `trident eval --help`, wrapped to `width`."""
    entries = [f"{header}: {legend}" for header, legend in METRICS.values()]
    lines = ["columns (mean ± 95 % interval over markets):"]
    for entry in [*entries, return_formula()]:
        lines += textwrap.wrap(entry, width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def metrics(trace: Trace) -> dict[str, Interval]:
    """Per-episode metrics (METRICS' keys) as mean ± 95 % interval over the markets."""
    held = mean_abs_inventory(trace.inventory)
    return {
        "return": interval(trace.episode_return),
        "pnl": interval(trace.pnl[-1]),
        "map": interval(held),
        "pnl_per_map": ratio_of_means(trace.pnl[-1], held),
        "sharpe": interval(sharpe(trace.pnl)),
        "max_drawdown": interval(max_drawdown(trace.pnl)),
        "taker_lots": interval(trace.taken.sum(axis=0)),
        "passive_lots": interval(trace.passive.sum(axis=0)),
    }


# ------------------------------------------------------------------------------ the report
@dataclass(frozen=True)
class Paired:
    """Trained − baseline, per market on the same markets: return and final PnL."""

    episode_return: Interval
    pnl: Interval
    identical: bool  # the same PnL and inventory paths on every market

    @property
    def verdict(self) -> str:
        """Better / worse where the return difference's interval lies above / below 0."""
        if self.identical:
            return "identical"
        if self.episode_return.low > 0:
            return "better"
        if self.episode_return.high < 0:
            return "worse"
        return "no significant difference"

    def to_json(self) -> dict:
        return {"return": self.episode_return.to_json(), "pnl": self.pnl.to_json(),
                "identical": self.identical, "verdict": self.verdict}  # fmt: skip


def paired(trained: Trace, baseline: Trace) -> Paired:
    same = bool(
        np.array_equal(trained.pnl, baseline.pnl)
        and np.array_equal(trained.inventory, baseline.inventory)
    )
    return Paired(
        paired_difference(trained.episode_return, baseline.episode_return),
        paired_difference(trained.pnl[-1], baseline.pnl[-1]),
        same,
    )


@dataclass(frozen=True)
class Report:
    """One comparison on `markets` held-out markets of seed `seed`."""

    seed: int
    markets: int
    cfg: LobsimConfig
    tuning: ASTuning
    metrics: dict[str, dict[str, Interval]]  # policy -> METRICS key -> interval
    paired: dict[str, Paired]  # baseline -> trained − baseline (empty without a trained policy)
    traces: dict[str, Trace] = field(repr=False, compare=False)

    @property
    def baselines(self) -> list[str]:
        return [name for name in self.metrics if name != TRAINED]

    @property
    def best_baseline(self) -> str:
        """The baseline with the highest mean return (the first listed on a tie)."""
        return max(self.baselines, key=lambda name: self.metrics[name]["return"].mean)

    def beats(self, baseline: str) -> bool:
        """Whether the trained policy's per-market return difference against `baseline` has
        its whole 95 % interval above 0."""
        if baseline not in self.paired:
            raise KeyError(f"baseline: expected one of {sorted(self.paired)}, got {baseline!r}")
        return self.paired[baseline].verdict == "better"

    def verdict(self) -> str:
        """One line: the trained policy against the best baseline, and the markets it played."""
        best = self.best_baseline
        head = f"verdict ({self.markets} held-out markets, seed {self.seed}):"
        level = self.metrics[best]["return"]
        if not self.paired:
            return f"{head} the best baseline is {best} (return {level})"
        trained, mine = self.metrics[TRAINED]["return"], self.paired[best]
        if mine.identical:
            line = (f"{head} the trained agent equals the best baseline, {best}: it plays "
                    f"exactly like it (identical PnL and inventory paths on every market; "
                    f"return {trained}), so it does not beat it")  # fmt: skip
        else:
            outcome = {
                "better": "beats",
                "worse": "is worse than",
                "no significant difference": "does not differ significantly from",
            }[mine.verdict]
            line = (f"{head} the trained agent {outcome} the best baseline, {best}: return "
                    f"{trained} against {level}, paired difference {mine.episode_return} "
                    "ticks per episode")  # fmt: skip
            if mine.verdict == "no significant difference":
                line += " (its 95 % interval includes 0)"
        same = [name for name, p in self.paired.items() if p.identical and name != best]
        if same:
            line += f"; it plays exactly like {', '.join(same)}"
        return line

    def table(self) -> str:
        """The policies x metrics table, the paired-difference table and their legends."""
        header = ["policy", *(METRICS[key][0] for key in METRICS)]
        rows = [[name, *(str(row[key]) for key in METRICS)] for name, row in self.metrics.items()]
        lines = _columns([header, *rows])
        lines.append(f"mean ± 95 % interval (1.96 standard errors) over {self.markets} markets, "
                     "one episode each:")  # fmt: skip
        lines += [f"  {METRICS[key][0]}: {METRICS[key][1]}" for key in METRICS]
        lines.append(f"  {return_formula(self.cfg)}")
        if self.paired:
            header = ["baseline", "Δ return", "Δ final PnL", "verdict"]
            rows = [[name, str(p.episode_return), str(p.pnl), p.verdict]
                    for name, p in self.paired.items()]  # fmt: skip
            lines += ["", *_columns([header, *rows])]
            lines += [
                f"Δ: {TRAINED} − baseline per market (same markets, same background flow), "
                "mean ± 95 % interval;",
                "  verdict: better / worse where the Δ return interval lies wholly above / "
                "below 0, identical where the PnL and inventory paths are the same",
            ]
        return "\n".join(lines)

    def text(self) -> str:
        """What `trident eval` and the main job print: the tuned Avellaneda–Stoikov, the
        tables with their legends, and the verdict."""
        tuned = self.tuning
        return "\n".join([
            f"Avellaneda-Stoikov: gamma {tuned.gamma:g}, k {tuned.k:g}, tuned on training seed "
            f"{tuned.seed} ({len(tuned.grid.pairs)} pairs x {tuned.grid.markets_per_pair} "
            f"markets; return {tuned.score} there)",
            self.table(),
            self.verdict(),
        ])  # fmt: skip

    def to_json(self) -> dict:
        """Every number of the report, JSON-ready (undefined values as null)."""
        return {
            "seed": self.seed,
            "markets": self.markets,
            "horizon": self.cfg.horizon,
            "interval": "mean ± 1.96 standard errors over markets (one episode per market)",
            "lobsim": dataclasses.asdict(self.cfg),
            "avellaneda_stoikov": self.tuning.to_json(),
            "metrics": {key: legend for key, (_, legend) in METRICS.items()},
            "return_formula": return_formula(self.cfg),
            "policies": {
                name: {key: value.to_json() for key, value in row.items()}
                for name, row in self.metrics.items()
            },
            "best_baseline": self.best_baseline,
            "paired": {name: p.to_json() for name, p in self.paired.items()},
            "beats": {name: self.beats(name) for name in self.paired},
            "verdict": self.verdict(),
        }


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned first column, right-aligned others, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def compare(
    agent: PolicyFactory | None,
    cfg: LobsimConfig,
    seed: int,
    train_seed: int,
    markets: int = EVAL_MARKETS,
    out_dir: Path | None = None,
    grid: ASGrid | None = None,
    title: str = "LobSim",
    progress: TextIO | None = None,
) -> Report:
    """The evaluation: tune Avellaneda–Stoikov on training seed `train_seed`, then play the
    trained policy `agent` (None: baselines only) and every baseline for one episode on the
    same `markets` held-out markets of seed `seed`; with `out_dir`, write JSON_NAME, TEXT_NAME
    and PNG_NAME there. With a `progress` stream, the episodes played show there as they go
    (progress.Phases: a bar on a terminal; a line as the tuning and each policy finish)."""
    if isinstance(markets, bool) or not isinstance(markets, int) or markets < 2:
        raise ValueError(f"markets: expected an integer >= 2 (an interval needs two markets), "
                         f"got {markets!r}")  # fmt: skip
    if seed == train_seed:
        raise ValueError(f"seed: the held-out seed must differ from train_seed, the training "
                         f"seed Avellaneda–Stoikov is tuned on; both are {seed}")  # fmt: skip
    grid = grid or ASGrid()
    tune_markets = len(grid.pairs) * grid.markets_per_pair
    played = (agent is not None) + len(baselines(seed))  # policies
    phases = None
    if progress is not None:
        total = tune_markets + markets * played
        phases = Phases("evaluation", total, 1 + played, stream=progress)
    try:
        tuning = tune_avellaneda_stoikov(cfg, train_seed, grid, phases)
        if phases is not None:
            phases.end(f"Avellaneda-Stoikov tuned on {tune_markets} training markets")
        policies = {} if agent is None else {TRAINED: agent}
        policies.update(baselines(seed, tuning.gamma, tuning.k))
        traces = play_all(policies, cfg, seed, markets, phases)
    finally:
        if phases is not None:
            phases.close()
    results = {name: metrics(trace) for name, trace in traces.items()}
    comparisons = {}
    if agent is not None:
        comparisons = {name: paired(traces[TRAINED], trace)
                       for name, trace in traces.items() if name != TRAINED}  # fmt: skip
    report = Report(seed, markets, cfg, tuning, results, comparisons, traces)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / JSON_NAME).write_text(json.dumps(report.to_json(), indent=2) + "\n")
        (out_dir / TEXT_NAME).write_text(report.text() + "\n")
        plot(traces, out_dir / PNG_NAME, f"{title}: {markets} held-out markets, seed {seed}")
    return report


# colour, dashes and marker of each baseline; markers at staggered steps keep baselines that
# coincide apart. The trained policy is drawn last, black, solid and thicker, on top.
STYLES = [("tab:blue", "--", "o"), ("tab:orange", ":", "v"), ("tab:green", "-.", "s"),
           ("tab:red", (0, (5, 1)), "^"), ("tab:purple", (0, (3, 1, 1, 1, 1, 1)), "D"),
           ("tab:brown", (0, (1, 2)), "x")]  # fmt: skip


def plot(traces: Mapping[str, Trace], path: Path, title: str) -> None:
    """PNG: mean PnL and mean |inventory| over the markets against the step, one line per
    policy (both start at 0 before the first step); TRAINED, if present, on top, and a baseline
    it plays exactly like says so in the legend (its markers show beside the trained line)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 7))
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True)
    names = [name for name in traces if name != TRAINED] + [n for n in traces if n == TRAINED]
    for i, name in enumerate(names):
        trace = traces[name]
        steps = np.arange(trace.pnl.shape[0] + 1)
        if name == TRAINED:
            style = {"color": "black", "linestyle": "-", "linewidth": 2.4, "zorder": 10}
        else:
            color, dash, marker = STYLES[i % len(STYLES)]
            every = max(1, steps.size // 10)
            style = {"color": color, "linestyle": dash, "linewidth": 1.6, "zorder": 2 + i,
                     "marker": marker, "markersize": 5,
                     "markevery": (i * every // len(STYLES) % every, every)}  # fmt: skip
        label = name
        if name != TRAINED and TRAINED in traces and paired(traces[TRAINED], trace).identical:
            label += " (same as trained)"
        top.plot(steps, np.concatenate([[0.0], trace.pnl.mean(axis=1)]), label=label, **style)
        bottom.plot(steps, np.concatenate([[0.0], np.abs(trace.inventory).mean(axis=1)]), **style)
    top.set_ylabel("mean PnL (ticks)")
    top.legend(fontsize="small")
    bottom.set_ylabel("mean |inventory| (lots)")
    bottom.set_xlabel("step")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
