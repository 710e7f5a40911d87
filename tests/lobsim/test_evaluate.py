"""Evaluation on held-out LobSim markets (service/lobsim/evaluate.py) and `trident eval`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.checkpoint import list_checkpoints
from service.config import LobsimConfig
from service.lobsim import evaluate
from service.lobsim.env import LobSim
from tests.test_cli import trident

SMALL_TOML = (
    '[model]\nhidden_dim = 32\n[train]\nbackend = "numpy"\nsteps = 2\nlog_every = 2\n'
    "num_envs = 8\nrollout_len = 4\n[replay]\nmin_size = 16\nbatch_size = 16\n"
    "[lobsim]\nhorizon = 6\n"
)
POLICIES = ("trained (greedy-π)", "hold", "random", "quote(0,0)", "avellaneda-stoikov")


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
    got = evaluate.avellaneda_stoikov_actions(
        np.array([(bid + ask) / 2]), np.array([bid]), np.array([ask]), np.array([inventory]),
        np.array([variance]), np.array([steps_left]),
    )  # fmt: skip
    assert got.tolist() == [action], case


def test_avellaneda_stoikov_reads_the_env() -> None:
    env = LobSim(4, LobsimConfig(), seed=3)  # reset: spread of two ticks, t = 0 of 400
    env.books.inventory[:] = [0, 3, -3, 0]
    env.variance[:] = 0.005
    policy = evaluate.AvellanedaStoikov(env)
    assert policy(env.reset(), env.action_mask()).tolist() == [2, 6, 5, 2]


def test_sharpe_of_hand_made_pnl() -> None:
    pnl = np.array([[1.0, 1.0], [0.0, 2.0], [2.0, 3.0]])  # increments (1, -1, 2) and (1, 1, 1)
    increments = np.array([1.0, -1.0, 2.0])
    expected = increments.mean() / increments.std(ddof=1) * np.sqrt(3)
    np.testing.assert_allclose(evaluate.sharpe(pnl), [expected, 0.0])  # constant: 0


def test_metrics_of_a_tiny_run_are_consistent() -> None:
    cfg, seed, markets = LobsimConfig(horizon=6), 11, 8
    traces, cash = {}, {}
    for name, make in evaluate.baselines(seed).items():
        env = LobSim(markets, cfg, seed)
        original, seen = env._reset, []

        def reset(original=original, seen=seen, env=env) -> None:
            seen.append(env.books.cash.copy())  # after the liquidation, before the reset
            original()

        env._reset = reset  # type: ignore[method-assign]
        traces[name] = evaluate.play_episode(env, make(env))
        (cash[name],) = seen
    for name, trace in traces.items():
        assert trace.pnl.shape == trace.inventory.shape == trace.taken.shape == (6, markets)
        np.testing.assert_array_equal(trace.pnl[-1], cash[name])
        assert (trace.inventory[-1] == 0).all()
        np.testing.assert_allclose(trace.episode_return, trace.reward.sum(axis=0), atol=1e-4)
        metrics = evaluate.metrics(trace)
        assert all(np.isfinite([m.mean, m.half]).all() for m in metrics.values()), name
        assert metrics["final PnL"].mean == pytest.approx(trace.pnl[-1].mean())
        assert metrics["taker lots"].mean == pytest.approx(trace.taken.sum(axis=0).mean())
    hold = evaluate.metrics(traces["hold"])
    assert hold["taker lots"].mean == hold["passive lots"].mean == hold["final PnL"].mean == 0
    assert evaluate.metrics(traces["random"])["taker lots"].mean > 0
    assert (traces["avellaneda-stoikov"].taken == 0).all()  # it only quotes


def test_eval_cli_prints_the_table_and_writes_the_png(tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text(SMALL_TOML)
    done = trident("train", "--config", "small.toml", "--set", "checkpoint.dir=ckpt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (saved,) = list_checkpoints(tmp_path / "ckpt")
    done = trident(
        "eval", saved.name, "--checkpoint-dir", "ckpt", "--config", "small.toml",
        "--episodes", "8", "--out-png", "plots/eval.png", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"trident eval: checkpoint {saved.name}, 8 held-out markets")
    assert lines[1].split()[:3] == ["policy", "final", "PnL"]
    for policy in POLICIES:
        (row,) = [line for line in lines if line.startswith(policy)]
        assert row.count("±") == 6, row
    assert (tmp_path / "plots" / "eval.png").read_bytes().startswith(b"\x89PNG")

    missing = trident("eval", "nope", "--checkpoint-dir", "ckpt", cwd=tmp_path)
    assert missing.returncode == 2 and "no checkpoint named 'nope'" in missing.stderr
    other = trident(
        "eval", saved.name, "--checkpoint-dir", "ckpt", "--config", "small.toml",
        "--set", "lobsim.visible_levels=5", cwd=tmp_path,
    )  # fmt: skip
    assert other.returncode == 2 and "model.obs_dim" in other.stderr
