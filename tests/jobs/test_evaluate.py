"""Evaluation on held-out LobSim markets (service/jobs/evaluate.py) and `trident eval`."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from service.checkpoint import list_checkpoints
from service.config import LobsimConfig
from service.jobs import evaluate
from service.lobsim import baselines
from service.lobsim.env import LobSim
from tests.cli.test_cli import trident

SMALL_TOML = (
    '[model]\nhidden_dim = 32\n[train]\nbackend = "numpy"\nsteps = 2\nlog_every = 2\n'
    "num_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
    "[lobsim]\nhorizon = 6\n"
)
BASELINES = ("hold", "random", "quote(0,0)", "inventory-skew", "avellaneda-stoikov")
POLICIES = (evaluate.TRAINED, *BASELINES)
TINY_GRID = evaluate.ASGrid(gammas=(0.1, 3.0), ks=(0.3, 10.0), markets_per_pair=3)
Z95 = statistics.NormalDist().inv_cdf(0.975)  # 1.95996..., the code rounds it to 1.96


def metric_rows(lines: list[str]) -> dict[str, str]:
    """The policies x metrics table's rows by policy (the table starts at the 'policy' header
    and ends at its legend)."""
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["policy"])
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("mean ± 95 %"))
    return {p: line for line in lines[start + 1 : end] for p in POLICIES if line.startswith(p)}


# ------------------------------------------------------------------------------ policies
@pytest.mark.parametrize(
    ("case", "bid", "ask", "inventory", "variance", "steps_left", "action"),
    [
        # calm, flat: quotes (1/γ)·ln(1 + γ/k) ≈ 0.61 tick from the mid, at the touches
        ("flat", 100, 101, 0, 0.0, 400, 2),
        # long 3 lots: r = mid − 3·0.6, bid 2.2 ticks behind, ask inside the spread -> (2, 0)
        ("long", 100, 101, 3, 0.005, 400, 6),
        ("short", 100, 101, -3, 0.005, 400, 5),
        # no time left: no inventory risk, the long quotes at the touches again
        ("long at the end", 100, 101, 3, 0.005, 0, 2),
        # γσ²(T − t) widens both quotes: 0.71 ticks behind -> (1, 1); 3.1 -> (3, 3)
        ("volatile", 100, 101, 0, 0.01, 400, 3),
        ("very volatile", 100, 101, 0, 0.05, 400, 4),
        # a wide spread: quotes inside it join the touches
        ("wide spread", 100, 103, 0, 0.0, 400, 2),
    ],
)
def test_avellaneda_stoikov_maps_its_quotes_to_the_nearest_action(
    case: str, bid: int, ask: int, inventory: int, variance: float, steps_left: int, action: int
) -> None:
    got = baselines.avellaneda_stoikov_actions(
        np.array([(bid + ask) / 2]), np.array([bid]), np.array([ask]), np.array([inventory]),
        np.array([variance]), np.array([steps_left]),
    )  # fmt: skip
    assert got.tolist() == [action], case


def test_avellaneda_stoikov_reads_the_env_with_one_gamma_per_market() -> None:
    env = LobSim(4, LobsimConfig(), seed=3)  # reset: spread of two ticks, t = 0 of 400
    env.books.inventory[:] = [0, 3, -3, 0]
    policy = baselines.AvellanedaStoikov(env)  # σ̂² = the prior 0.005 before any step
    np.testing.assert_allclose(policy.variance(), baselines.AS_PRIOR_VARIANCE)
    assert policy(env.reset(), env.action_mask()).tolist() == [2, 6, 5, 2]
    # γ = 3 on the last market: γσ²(T − t) = 6 ticks, both quotes far behind -> (3, 3)
    wide = baselines.AvellanedaStoikov(env, gamma=np.array([0.3, 0.3, 0.3, 3.0]))
    assert wide(env.reset(), env.action_mask()).tolist() == [2, 6, 5, 4]
    with pytest.raises(ValueError, match="gamma"):
        baselines.AvellanedaStoikov(env, gamma=np.array([0.3, -1.0, 0.3, 0.3]))
    with pytest.raises(ValueError, match="k: "):
        baselines.AvellanedaStoikov(env, k=0.0)


def test_avellaneda_stoikov_variance_is_the_episode_realised_variance_with_a_prior(
    rng: np.random.Generator,
) -> None:
    # brisk market orders so the mid moves within a short episode
    cfg, markets, horizon = LobsimConfig(horizon=12, market_weight=300), 16, 12
    env = LobSim(markets, cfg, seed=int(rng.integers(1, 2**31)))
    policy = baselines.AvellanedaStoikov(env, prior_variance=0.02, prior_steps=5)
    mids, estimates = [], []
    for _ in range(horizon + 2):  # into the next episode, where the estimate starts afresh
        actions = policy(env.reset(), env.action_mask())
        mids.append(env.books.base + env.mid2 / 2.0)  # absolute ticks, before the step
        estimates.append(policy.variance())
        env.step(actions)
    mids = np.array(mids)
    squares = np.cumsum(np.diff(mids[:horizon], axis=0) ** 2, axis=0)
    assert squares[-1].sum() > 0, "the mid never moved: the test shows nothing"
    for t in range(horizon):
        moved = squares[t - 1] if t else np.zeros(markets)
        np.testing.assert_allclose(estimates[t], (5 * 0.02 + moved) / (5 + t), rtol=1e-12)
    next_episode = (mids[horizon + 1] - mids[horizon]) ** 2
    np.testing.assert_allclose(estimates[horizon], 0.02)
    np.testing.assert_allclose(estimates[horizon + 1], (5 * 0.02 + next_episode) / 6)


def test_skew_rule_quotes_away_from_its_inventory(rng: np.random.Generator) -> None:
    inventory = rng.integers(-6, 7, 64)
    expected = [6 if q > 0 else 5 if q < 0 else 2 for q in inventory]  # (2,0) / (0,2) / (0,0)
    assert baselines.skew_actions(inventory).tolist() == expected
    env = LobSim(8, LobsimConfig(), seed=int(rng.integers(1, 2**31)))
    env.books.inventory[:] = inventory[:8]
    policy = baselines.inventory_skew(env)
    assert policy(env.reset(), env.action_mask()).tolist() == expected[:8]


# ------------------------------------------------------------------------------ statistics
def test_interval_and_paired_difference_match_an_independent_computation(
    rng: np.random.Generator,
) -> None:
    n = int(rng.integers(20, 60))
    common = rng.normal(0.0, 5.0, n)  # the market, shared by both policies: it cancels
    a, b = common + rng.normal(1.0, 0.5, n), common + rng.normal(0.0, 0.5, n)
    diff = [float(x - y) for x, y in zip(a, b, strict=True)]
    got = evaluate.paired_difference(a, b)
    assert got.n == n
    assert got.mean == pytest.approx(statistics.fmean(diff), rel=1e-12)
    assert got.half == pytest.approx(Z95 * statistics.stdev(diff) / math.sqrt(n), rel=1e-4)
    single = evaluate.interval(a)
    assert single.half == pytest.approx(Z95 * statistics.stdev(a.tolist()) / math.sqrt(n), 1e-4)
    assert (single.low, single.high) == (single.mean - single.half, single.mean + single.half)
    assert got.half < single.half  # pairing removes the shared market's variance
    with pytest.raises(ValueError, match="a and b"):
        evaluate.paired_difference(a, b[:-1])
    with pytest.raises(ValueError, match="values"):
        evaluate.interval(a[:1])
    with pytest.raises(ValueError, match="values"):
        evaluate.interval(np.array([1.0, np.nan]))


def test_pnl_per_map_is_a_ratio_of_means_with_a_delta_method_interval(
    rng: np.random.Generator,
) -> None:
    # by hand: R = (4 − 1)/2 / ((0.5 + 1.5)/2) = 1.5; y − R·x = (3.25, −3.25), sd = 3.25·√2
    got = evaluate.ratio_of_means(np.array([4.0, -1.0]), np.array([0.5, 1.5]))
    assert got.mean == pytest.approx(1.5)
    assert got.half == pytest.approx(1.96 * 3.25 * math.sqrt(2) / math.sqrt(2) / 1.0)
    # fresh data against the formula written out
    y, x = rng.normal(10.0, 4.0, 40), rng.uniform(0.2, 3.0, 40)
    ratio = statistics.fmean(y) / statistics.fmean(x)
    residual = [float(yi - ratio * xi) for yi, xi in zip(y, x, strict=True)]
    got = evaluate.ratio_of_means(y, x)
    assert got.mean == pytest.approx(ratio, rel=1e-12)
    expected = Z95 * statistics.stdev(residual) / (math.sqrt(40) * statistics.fmean(x))
    assert got.half == pytest.approx(expected, rel=1e-4)
    # never holding inventory: undefined, shown as n/a and written as null
    undefined = evaluate.ratio_of_means(y[:5], np.zeros(5))
    assert math.isnan(undefined.mean) and str(undefined) == "n/a"
    assert undefined.to_json() == {"mean": None, "half": None, "n": 5}


def test_max_drawdown_of_hand_made_paths(rng: np.random.Generator) -> None:
    # paths from 0: (0, 1, 3, 0, 2) falls 3 from its peak; (0, −1, −2, 1, 0) falls 2 from 0
    pnl = np.array([[1.0, -1.0], [3.0, -2.0], [0.0, 1.0], [2.0, 0.0]])
    np.testing.assert_allclose(evaluate.max_drawdown(pnl), [3.0, 2.0])
    paths = np.cumsum(rng.normal(0.0, 1.0, (30, 5)), axis=0)
    for market in range(5):
        peak, worst = 0.0, 0.0
        for value in paths[:, market]:
            peak = max(peak, value)
            worst = max(worst, peak - value)
        assert evaluate.max_drawdown(paths)[market] == pytest.approx(worst)


def test_mean_abs_inventory_of_a_hand_made_path() -> None:
    inventory = np.array([[1, -2], [3, -2], [-1, 0], [0, 0]])  # the last step: liquidated
    np.testing.assert_allclose(evaluate.mean_abs_inventory(inventory), [5 / 4, 4 / 4])


def test_sharpe_of_hand_made_pnl() -> None:
    pnl = np.array([[1.0, 1.0], [0.0, 2.0], [2.0, 3.0]])  # increments (1, -1, 2) and (1, 1, 1)
    increments = np.array([1.0, -1.0, 2.0])
    expected = increments.mean() / increments.std(ddof=1) * np.sqrt(3)
    np.testing.assert_allclose(evaluate.sharpe(pnl), [expected, 0.0])  # constant: 0


# ------------------------------------------------------------------------------ episodes
def test_metrics_of_a_tiny_run_are_consistent() -> None:
    cfg, seed, markets = LobsimConfig(horizon=6), 11, 8
    traces, cash = {}, {}
    for name, make in baselines.baselines(seed).items():
        env = LobSim(markets, cfg, seed)
        seen = []

        def step(actions, step=env.step, seen=seen):  # records the cash the env reports
            out = step(actions)
            seen.append(out.info["cash"])
            return out

        env.step = step  # type: ignore[method-assign]
        traces[name] = evaluate.play_episode(env, make(env))
        cash[name] = seen[-1]  # after the liquidation, before the reset
    assert tuple(traces) == BASELINES
    for name, trace in traces.items():
        assert trace.pnl.shape == trace.inventory.shape == trace.taken.shape == (6, markets)
        np.testing.assert_array_equal(trace.pnl[-1], cash[name])
        assert (trace.inventory[-1] == 0).all()
        np.testing.assert_allclose(trace.episode_return, trace.reward.sum(axis=0), atol=1e-4)
        metrics = evaluate.metrics(trace)
        assert set(metrics) == set(evaluate.METRICS)
        assert metrics["pnl"].mean == pytest.approx(trace.pnl[-1].mean())
        assert metrics["taker_lots"].mean == pytest.approx(trace.taken.sum(axis=0).mean())
        assert metrics["max_drawdown"].mean >= 0
    hold = evaluate.metrics(traces["hold"])
    assert hold["taker_lots"].mean == hold["passive_lots"].mean == hold["pnl"].mean == 0
    assert math.isnan(hold["pnl_per_map"].mean)
    assert evaluate.metrics(traces["random"])["taker_lots"].mean > 0
    for name in ("inventory-skew", "avellaneda-stoikov"):
        assert (traces[name].taken == 0).all()  # they only quote


def test_grid_search_picks_the_best_pair_of_a_brute_force_evaluation(
    rng: np.random.Generator,
) -> None:
    cfg, seed = LobsimConfig(horizon=8), int(rng.integers(1, 2**31))
    tuned = evaluate.tune_avellaneda_stoikov(cfg, seed, TINY_GRID)
    pairs, m = TINY_GRID.pairs, TINY_GRID.markets_per_pair
    brute = []
    for p, (gamma, k) in enumerate(pairs):  # every market on this pair; keep pair p's block
        env = LobSim(len(pairs) * m, cfg, seed)
        returns = evaluate.play_episode(env, baselines.AvellanedaStoikov(env, gamma, k))
        brute.append(returns.episode_return[p * m : (p + 1) * m])
    means = [float(np.mean(r)) for r in brute]
    assert len(set(means)) > 1, "every pair scored the same: the test shows nothing"
    assert [s.mean for s in tuned.scores] == pytest.approx(means, rel=1e-12, abs=1e-12)
    # the highest lower 95 % bound, written out
    lower = [np.mean(r) - 1.96 * np.std(r, ddof=1) / np.sqrt(len(r)) for r in brute]
    best = int(np.argmax(lower))
    assert (tuned.gamma, tuned.k) == pairs[best] and tuned.seed == seed
    assert tuned.score == evaluate.interval(brute[best])


def test_grid_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="markets_per_pair"):
        evaluate.ASGrid(markets_per_pair=1)
    with pytest.raises(ValueError, match="gammas"):
        evaluate.ASGrid(gammas=())
    with pytest.raises(ValueError, match="ks"):
        evaluate.ASGrid(ks=(1.0, -0.5))


def test_compare_rejects_too_few_markets_and_the_tuning_seed() -> None:
    cfg = LobsimConfig(horizon=4)
    with pytest.raises(ValueError, match="markets"):
        evaluate.compare(None, cfg, seed=5, train_seed=1, markets=1, grid=TINY_GRID)
    with pytest.raises(ValueError, match="seed: the held-out seed must differ from train_seed"):
        evaluate.compare(None, cfg, seed=7, train_seed=7, grid=TINY_GRID)


def test_compare_writes_every_number_and_judges_the_agent(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    cfg, markets = LobsimConfig(horizon=6), 8
    train_seed = int(rng.integers(0, 2**31))
    seed = train_seed + 1_000_003
    # the skew rule as the "trained" policy: it must be judged identical to that baseline
    report = evaluate.compare(
        baselines.inventory_skew, cfg, seed, train_seed, markets, tmp_path / "out", TINY_GRID
    )
    assert report.tuning.seed == train_seed != report.seed == seed
    assert tuple(report.metrics) == POLICIES and tuple(report.paired) == BASELINES
    assert report.paired["inventory-skew"].identical
    assert report.paired["inventory-skew"].verdict == "identical"
    assert not report.beats("inventory-skew")
    assert "plays exactly like" in report.verdict()
    for name in BASELINES:
        diff = report.traces[evaluate.TRAINED].episode_return - report.traces[name].episode_return
        assert report.paired[name].episode_return.mean == pytest.approx(diff.mean())
        low = report.paired[name].episode_return.low
        assert report.beats(name) == (low > 0 and not report.paired[name].identical)
    best = max(BASELINES, key=lambda name: report.traces[name].episode_return.mean())
    assert report.best_baseline == best and f"the best baseline, {best}" in report.verdict()
    assert report.verdict().startswith(f"verdict ({markets} held-out markets, seed {seed}): ")
    with pytest.raises(KeyError, match="baseline"):
        report.beats("nope")

    saved = json.loads((tmp_path / "out" / evaluate.JSON_NAME).read_text())
    assert saved == json.loads(json.dumps(report.to_json()))
    assert (saved["seed"], saved["markets"], saved["horizon"]) == (seed, markets, 6)
    tuned = saved["avellaneda_stoikov"]
    assert (tuned["gamma"], tuned["k"], tuned["seed"]) == (
        report.tuning.gamma, report.tuning.k, train_seed,
    )  # fmt: skip
    assert len(tuned["grid"]) == len(TINY_GRID.pairs)
    for name in POLICIES:
        trace = report.traces[name]
        returns = saved["policies"][name]["return"]
        assert returns["mean"] == pytest.approx(trace.episode_return.mean())
        assert returns["n"] == markets
        assert saved["policies"][name]["pnl"]["mean"] == pytest.approx(trace.pnl[-1].mean())
    assert saved["policies"]["hold"]["pnl_per_map"]["mean"] is None
    assert saved["paired"]["inventory-skew"]["identical"] is True
    assert saved["beats"] == {name: report.beats(name) for name in BASELINES}
    assert saved["best_baseline"] == best and saved["verdict"] == report.verdict()
    assert (tmp_path / "out" / evaluate.PNG_NAME).read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "out" / evaluate.TEXT_NAME).read_text() == report.text() + "\n"

    text = report.text().splitlines()
    rows = metric_rows(text)
    assert set(rows) == set(POLICIES)
    assert all(row.count("±") + row.count("n/a") == len(evaluate.METRICS) for row in rows.values())
    assert any(line.startswith("Δ: ") for line in text) and text[-1] == report.verdict()


def test_compare_without_an_agent_names_the_best_baseline() -> None:
    report = evaluate.compare(None, LobsimConfig(horizon=4), 9, 2, markets=4, grid=TINY_GRID)
    assert tuple(report.metrics) == BASELINES and report.paired == {}
    assert report.verdict() == (f"verdict (4 held-out markets, seed 9): the best baseline is "
                                f"{report.best_baseline} "
                                f"(return {report.metrics[report.best_baseline]['return']})")


# ------------------------------------------------------------------------------ the CLI
def test_eval_cli_prints_the_tables_and_writes_json_and_png(tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text(SMALL_TOML)
    done = trident("train", "--config", "small.toml", "--set", "checkpoint.dir=ckpt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (saved,) = list_checkpoints(tmp_path / "ckpt")
    done = trident(
        "eval", f"ckpt/{saved.name}", "--config", "small.toml", "--episodes", "8",
        "--tune-markets", "2", "--out-dir", "out", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"trident eval: checkpoint ckpt/{saved.name}, 8 held-out markets")
    assert "seed 1000003" in lines[0]
    # a line as each part of the evaluation ends (no bar: stdout is a pipe), 40 + 6 x 8 episodes
    progress = [line.rsplit(" (", 1)[0] for line in lines[1:8]]
    assert progress == ["evaluation 1/7: Avellaneda-Stoikov tuned on 40 training markets"] + [
        f"evaluation {k}/7: {name} played 8 markets" for k, name in enumerate(POLICIES, 2)
    ]
    assert [line.rsplit(" (", 1)[1].split(",")[0] for line in lines[1:8]] == [
        f"{40 + 8 * k}/88 episodes" for k in range(7)
    ]
    assert "\r" not in done.stdout
    assert lines[8].startswith("Avellaneda-Stoikov: gamma ") and "training seed 0" in lines[8]
    rows = metric_rows(lines)
    assert set(rows) == set(POLICIES)
    assert all(row.count("±") + row.count("n/a") == len(evaluate.METRICS) for row in rows.values())
    (verdict,) = [line for line in lines if line.startswith("verdict (8 held-out markets, seed "
                                                            "1000003): the trained agent ")]
    (formula,) = [line for line in lines if line.startswith("  return = final PnL − 0.1 × ")]
    assert "0.01 × Σ inventory²" in formula  # the markets' own settings
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert report["markets"] == 8 and report["seed"] == 1_000_003
    assert set(report["paired"]) == set(BASELINES) and report["verdict"] == verdict
    assert (tmp_path / "out" / "eval.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "out" / "eval.txt").read_text().splitlines()[-1] == verdict

    missing = trident("eval", "nope", "--checkpoint-dir", "ckpt", cwd=tmp_path)
    assert missing.returncode == 2 and "no checkpoint named 'nope'" in missing.stderr
    other = trident(
        "eval", saved.name, "--checkpoint-dir", "ckpt", "--config", "small.toml",
        "--set", "lobsim.visible_levels=5", cwd=tmp_path,
    )  # fmt: skip
    assert other.returncode == 2 and "model.obs_dim" in other.stderr
    few = trident("eval", saved.name, "--checkpoint-dir", "ckpt", "--episodes", "1", cwd=tmp_path)
    assert few.returncode == 2 and "--episodes" in few.stderr
    tuning_seed = trident(
        "eval", saved.name, "--checkpoint-dir", "ckpt", "--config", "small.toml",
        "--seed", "0", cwd=tmp_path,
    )  # fmt: skip
    assert tuning_seed.returncode == 2 and "--seed" in tuning_seed.stderr


def test_eval_help_explains_every_column() -> None:
    done = trident("eval", "--help", cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    words = " ".join(done.stdout.split())  # as argparse wraps it
    for header, legend in evaluate.METRICS.values():
        assert f"{header}: {' '.join(legend.split()[:4])}" in words
    assert "return = final PnL − lobsim.taker_fee × taker lots + lobsim.maker_rebate" in words
